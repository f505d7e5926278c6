"""Stand-in for vLLM's OpenAI-compatible server entry point (python3 -m vllm.entrypoints.openai.api_server)."""

import sys

from neuron_standin import server_main

sys.exit(server_main(sys.argv[1:], "vllm"))
