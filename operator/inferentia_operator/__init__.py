"""inferentia-operator: deploy ML models onto AWS Inferentia and Trainium (Neuron) clusters."""

__version__ = "0.2.0"
