"""EAGLE3 speculative decoding (spec.serving.speculation): where the vLLM Neuron plugin runs it, what
it takes beside it in serving.args, the draft's source and the tokens a step.

What the plugin documents, and each rule rests on:
- it runs on trn2 and trn3 ("This document is relevant for: Trn2, Trn3"), as vLLM's platform there:
  the speculative decoding design page,
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/design/speculation/speculative_decoding_design.html;
- the EAGLE3 design page's method row says "Must be "eagle3". Currently the only supported
  speculation method on Neuron"; the 2.33 docs add DFlash ("Speculative decoding (DFlash)",
  {"method": "dflash", ...},
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/design/speculation/dflash_speculative_decoding_design.html).
  The operator renders EAGLE3 only, the one speculative config, and a second one in serving.args
  (``--speculative-config``, or one of its keys as ``--speculative-config.<key>``, vLLM's dotted JSON
  flags) would change what the serving processes run and not what the compile step compiled;
- "Mutually exclusive with async scheduling. Setting --speculative-config disables async scheduling
  automatically with a startup warning" (the features guide, "Speculative decoding (EAGLE3)",
  https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/guides/features-guide.html):
  a user's ``--async-scheduling`` would be overridden, so it is refused, naming both;
- "Speculation is automatically skipped when a sequence's position reaches max_model_len -
  num_speculative_tokens" (the design page): a count of max_model_len or more never speculates,
  and the server still starts, so it is a warning;
  vLLM itself asks for more than zero ("Expected num_speculative_tokens to be greater than zero",
  vllm/config/speculative.py), which the schema's minimum holds.
The draft is read by vLLM itself (a Hugging Face id, or a path in the image): the operator fetches
no second model from a store, so an s3:// or https:// draft would fail at start.
"""

from __future__ import annotations

import json
import re

from inferentia_operator.core.api import InferentiaModelSpec
from inferentia_operator.core.catalogue import Family
from inferentia_operator.core.cel import CrossFieldRule
from inferentia_operator.core.cores import PLUGIN_FAMILIES, group_size_of, kv_cache, on_vllm_plugin, serving_count
from inferentia_operator.core.findings import Finding, or_list

_RUNTIME = "(has(self.serving.runtime) ? self.serving.runtime : 'custom')"
_FAMILY = "(has(self.compute.family) ? self.compute.family : 'inf1')"
_SPECULATES = "has(self.serving.speculation)"
SPECULATION_PLUGIN = CrossFieldRule(
    "spec.serving.speculation",
    "spec",
    "EAGLE3 speculative decoding runs on the vLLM Neuron plugin, and serving.runtime is %s on %s; valid specs set "
    f"serving.runtime: vllm and compute.family {or_list(PLUGIN_FAMILIES)}",
    f"!{_SPECULATES} || ({_RUNTIME} == 'vllm' && {_FAMILY} in {json.dumps(PLUGIN_FAMILIES)})",
    (_RUNTIME, _FAMILY),
)

# A Hugging Face model id as huggingface_hub's validate_repo_id takes it ("name" or "org/name"), the
# same pattern the compile step's hub_snapshot.REPO_ID uses; or an absolute path in the image.
# Python matches it with re.fullmatch: CEL's matches() is RE2, whose $ is the end of the text, while
# re.match's $ also matches before a last newline ("org/name\n"), which the API server refuses.
HUB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?$"
# An absolute path names a folder: "/" (or "//") alone is the image's root, no model.
ABSOLUTE_PATH_PATTERN = r"^/.*[^/]"
_DRAFT_URI = "self.serving.speculation.draft.uri"
DRAFT_SOURCE = CrossFieldRule(
    "spec.serving.speculation.draft.uri",
    "spec",
    "%s is not a model vLLM reads itself, and the draft is not fetched; valid values are a Hugging Face model id "
    "(org/name) or an absolute path in the serving image",
    f"!{_SPECULATES} || {_DRAFT_URI}.matches({json.dumps(ABSOLUTE_PATH_PATTERN)}) || {_DRAFT_URI}.matches({json.dumps(HUB_ID_PATTERN)})",
    (_DRAFT_URI,),
)

# vLLM's FlexibleArgumentParser reads underscores as dashes in a flag's name, and
# --speculative-config.<key> as one key of the same JSON object (vllm/utils/argparse_utils.py).
SPECULATIVE_FLAGS = ("--speculative-config", "--speculative_config")
_SECOND_CONFIG = " || ".join(f"a.startsWith({json.dumps(f)})" for f in SPECULATIVE_FLAGS)
SECOND_SPECULATIVE_CONFIG = CrossFieldRule(
    "spec.serving.args",
    "spec",
    "%s sets vLLM's speculative config a second time, beside spec.serving.speculation, and the compile step would "
    "not compile it; valid specs set it in spec.serving.speculation only",
    f"!{_SPECULATES} || !has(self.serving.args) || !self.serving.args.exists(a, {_SECOND_CONFIG})",
    (f"self.serving.args.filter(a, {_SECOND_CONFIG})[0]",),
)

ASYNC_FLAGS = ("--async-scheduling", "--async_scheduling")
_ASYNC = " || ".join(f"a == {json.dumps(f)}" for f in ASYNC_FLAGS)
_FIRST_ASYNC = f"self.serving.args.filter(a, {_ASYNC})[0]"
ASYNC_WITH_SPECULATION = CrossFieldRule(
    "spec.serving.args",
    "spec",
    "%s turns on async scheduling, which the vLLM Neuron plugin runs only without spec.serving.speculation (it turns "
    "it off); valid specs drop %s or spec.serving.speculation",
    f"!{_SPECULATES} || !has(self.serving.args) || !self.serving.args.exists(a, {_ASYNC})",
    (_FIRST_ASYNC, _FIRST_ASYNC),  # the message names the flag twice
)

# A warning, not an error: "Speculation is automatically skipped when a sequence's position reaches
# max_model_len - num_speculative_tokens", and "the system falls back to standard single-token
# decoding" (the speculative decoding design page,
# https://awsdocs-neuron.readthedocs-hosted.com/en/latest/vllm-neuron/docs/design/speculation/speculative_decoding_design.html):
# the server starts and serves, only never speculating, with the draft's weights and layer for nothing.
# No CEL twin: max_model_len is the largest bucket's last dimension, a maximum over a list of lists
# the API server's cost estimator cannot bound (rules.memory says the same of the KV cache).
TOKENS_PAST_MAX_MODEL_LEN = (
    "%d leaves no position to speculate at: the plugin skips speculation from max_model_len - numSpeculativeTokens "
    "on, and max_model_len is %d; valid values are 1 to %d"
)
DRAFT_WEIGHTS_UNKNOWN = (
    "not set, so the KV cache blocks are left to the vLLM Neuron plugin: the draft's weights share each core's memory "
    "with the target's; set the draft's parameters to have the plan size the cache"
)
HAND_WRITTEN_SPECULATION = (
    "%s sets a speculative config the plan does not know of: the KV cache blocks it gives the plugin leave no room for "
    "a draft's weights and layer, and the compile step compiles no draft; valid specs set spec.serving.speculation instead"
)


def _check_where(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    if spec.serving.speculation is None or on_vllm_plugin(spec, fam):
        return []
    return [SPECULATION_PLUGIN.finding(spec.serving.runtime, fam.name)]


def _check_draft(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    speculation = spec.serving.speculation
    uri = speculation.draft.uri if speculation is not None else ""
    if speculation is None or re.match(ABSOLUTE_PATH_PATTERN, uri) or re.fullmatch(HUB_ID_PATTERN, uri):
        return []
    return [DRAFT_SOURCE.finding(speculation.draft.uri)]


def _check_args(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    if spec.serving.speculation is None:
        return []
    args, found = spec.serving.args or [], []
    if second := next((a for a in args if a.startswith(SPECULATIVE_FLAGS)), None):
        found.append(SECOND_SPECULATIVE_CONFIG.finding(second))
    if on := next((a for a in args if a in ASYNC_FLAGS), None):
        found.append(ASYNC_WITH_SPECULATION.finding(on, on))
    return found


def max_model_len(spec: InferentiaModelSpec) -> int | None:
    """vLLM's max_model_len: serving.args' --max-model-len (they come last, and win), else the largest bucket's last dimension."""
    buckets = [b for b in spec.compile.buckets or [] if b]
    return serving_count(spec, "--max-model-len") or (max(b[-1] for b in buckets) if buckets else None)


def _check_tokens(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    speculation, longest = spec.serving.speculation, max_model_len(spec)
    if speculation is None or longest is None or speculation.num_speculative_tokens < longest:
        return []
    tokens = speculation.num_speculative_tokens
    text = TOKENS_PAST_MAX_MODEL_LEN % (tokens, longest, longest - 1)
    return [Finding("spec.serving.speculation.numSpeculativeTokens", text, "warning")]


def _check_sizing(spec: InferentiaModelSpec, fam: Family) -> list[Finding]:
    """Warnings: a draft of unknown size leaves the cache unsized; a hand-written speculative config
    leaves it sized for no draft."""
    m, speculation = spec.model, spec.serving.speculation
    sized = on_vllm_plugin(spec, fam) and None not in (m.weights, m.layers, m.kv_heads, m.head_dim)
    if speculation is not None:
        unknown = sized and speculation.draft.weights is None
        return [Finding("spec.serving.speculation.draft.weights", DRAFT_WEIGHTS_UNKNOWN, "warning")] if unknown else []
    hand_written = next((a for a in spec.serving.args or [] if a.startswith(SPECULATIVE_FLAGS)), None)
    if not sized or hand_written is None or serving_count(spec, "--num-gpu-blocks-override") is not None:
        return []
    # The plan's own count (the user's is theirs to size): a group of the replica's processes.
    return [Finding("spec.serving.args", HAND_WRITTEN_SPECULATION % hand_written, "warning")] if _planned_count(spec, fam) else []


def _planned_count(spec: InferentiaModelSpec, fam: Family) -> bool:
    group = group_size_of(spec, fam)
    return group is not None and kv_cache(spec, fam, group) is not None


RULES: list[CrossFieldRule] = [SPECULATION_PLUGIN, DRAFT_SOURCE, SECOND_SPECULATIVE_CONFIG, ASYNC_WITH_SPECULATION]
CHECKS = (_check_where, _check_draft, _check_args, _check_tokens, _check_sizing)
