from pathlib import Path

from setuptools import find_packages, setup

setup(
    name="darl",
    version="0.1.0",
    description="D-ARL: distribution-matched asynchronous RL for LLM reasoning, built on verl",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["recipe", "recipe.*"]),
    package_data={"recipe.darl": ["config/*.yaml", "config/replay/*.yaml", "config/rollout_shaping/*.yaml", "example/weights/*/*"]},
    install_requires=["verl==0.9.1"],
    # verl/__init__.py imports every "verl.plugins" entry point, in the driver and in each Ray worker;
    # the CPU platform plugin does nothing unless VERL_PLATFORM=cpu (recipe/darl/cpu/platform.py)
    # vLLM calls every "vllm.general_plugins" entry point in each of its processes; these do nothing unless
    # VERL_PLATFORM=cpu (then CPU linear layers keep their weights for weight sync, and half-written kernels a killed
    # process left in TorchInductor's cache are removed: recipe/darl/cpu/vllm_rollout)
    entry_points={
        "verl.plugins": ["darl_cpu = recipe.darl.cpu.platform", "darl_rollout = recipe.darl.cpu.rollout"],
        "vllm.general_plugins": ["darl_cpu_keep_weights = recipe.darl.cpu.vllm_rollout.keep_weights:register",
                                 "darl_cpu_inductor_cache = recipe.darl.cpu.vllm_rollout.inductor_cache:register"],
    },
)
