"""Stand-in of vllm.plugins: vLLM calls load_general_plugins() in every
process it starts; each entry point of the group vllm.general_plugins is
loaded and called (VLLM_PLUGINS, a comma-separated list, restricts them)."""
import os
from importlib.metadata import entry_points


def load_general_plugins():
    allowed = os.environ.get("VLLM_PLUGINS")
    names = None if allowed is None else {n.strip() for n in allowed.split(",") if n.strip()}
    for ep in entry_points(group="vllm.general_plugins"):
        if names is None or ep.name in names:
            ep.load()()
