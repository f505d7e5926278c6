"""A stand-in of NxD Inference (``neuronx-distributed-inference``), AWS's inference library for
Inferentia2 and Trainium, which vLLM on inf2 and trn1 runs on. It keeps the library's documented
interface as far as the operator and vLLM's loader use it: ``NeuronConfig`` and
``InferenceConfig`` (saved as ``neuron_config.json``), ``load_pretrained_config``, the model
classes in ``utils.constants.MODEL_TYPES``, and an application's ``compile(path)`` and
``load(path)``, with the compiled layout ``model.pt`` plus, with ``save_sharded_checkpoint``,
``weights/tp<rank>_sharded_checkpoint.safetensors``
(https://awsdocs-neuron.readthedocs-hosted.com/en/latest/libraries/nxd-inference/developer_guides/onboarding-models.html,
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/libraries/nxd-inference/developer_guides/weights-sharding-guide.html).
Compiling needs a target: a Neuron device's, or NEURON_PLATFORM_TARGET_OVERRIDE where there is
none. Nothing here compiles anything: model.pt records what a compile was asked for."""
