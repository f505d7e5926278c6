"""Autoscaling: the model's KEDA ScaledObject and the part that decides the replicas it leaves the Deployment."""
