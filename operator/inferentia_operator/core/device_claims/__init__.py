"""Device claims (allocation dra): the ResourceClaimTemplate the serving pods claim from, and the part."""
