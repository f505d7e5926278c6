"""Device faults: serving pods on nodes whose Neuron devices report errors, taken out of traffic or moved."""
