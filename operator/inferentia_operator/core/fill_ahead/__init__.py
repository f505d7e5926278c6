"""Fill-ahead: the artefact copied into node caches before a scale-up needs it."""
