"""llmdeploy: bring up, check and roll back multi-node LLM serving clusters over SSH."""

__version__ = "0.1.0"
