"""The simulated cluster: real sshd per host in its own network namespace,
with stand-ins for the hardware (npu-smi, hccn_tool, nvidia-smi, docker, ...)."""
