"""Saves a PyTorch model as the file the operator's compile program reads (spec.model.uri):
TorchScript from torch.jit.trace, or the module itself with torch.save. Here a small
convolutional network stands in for yours; trace yours with an input of its shape.

    python3 save_model.py model.pt
    aws s3 cp model.pt s3://models-example/resnet50/model.pt
"""

import sys

import torch


class Network(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1))
        self.classify = torch.nn.Linear(8, 10)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classify(self.features(images).flatten(1))


model = Network().eval()  # yours: torchvision.models.resnet50(weights="DEFAULT").eval(), say
example = torch.zeros(1, 3, 224, 224)  # one input of the shape of compile.buckets, with the batch dimension
torch.jit.save(torch.jit.trace(model, example), sys.argv[1])
