"""TorchTitan 0.3.0's own integration-test list, transcribed as data, and what a checkout's root
holds for it, so that tests/frameworks/test_torchtitan_integration.py and
benchmarks/frameworks/torchtitan_integration.py run each test exactly as TorchTitan's runner does.

Source: pytorch/torchtitan at commit 1fdf90d3f9b756ef709ce262bc839f1dab679b5e ("Set version to
0.3.0rc1", #4216), the last commit before the 0.3.0 wheel's version:
- tests/integration_tests/__init__.py: `OverrideDefinitions` (as is);
- tests/integration_tests/features.py: the raw list (`_integration_tests_flavors`, the list
  literal inside `build_features_test_list`, every entry and argument as written, lists kept as
  lists: the `(test_name, variant) not in unsupported_tests` check compares them) and the
  transform TorchTitan's CI passes it through (`_is_pp_only`, `_supports_spmd_typechecking`,
  `_configure_spmd_backend_and_typechecking`, as is), applied by `build_features_test_list`;
- tests/integration_tests/run_tests.py: the shell command `run_single_test` builds for each
  variant (`command`), sequential mode (`--no-parallel`: no CUDA_VISIBLE_DEVICES prefix; the
  parallel default only pins each test to distinct physical GPUs) with `--module`/`--config` at
  their defaults (main() does not pass them on, so run_train.sh's MODULE/CONFIG defaults hold),
  and the `_filter_tests` rule (disabled tests are not run; `--gpu_arch_type cuda`);
- run_train.sh and torchtitan_recipes/{__init__,tests}.py (RUN_TRAIN_SH, RECIPES_*), written into
  the working directory by `write_checkout` (the installed 0.3.0 wheel ships a different
  torchtitan_recipes package without `llama3_debugmodel_fsdp2_cp2` at the place the list names;
  `python -m` puts the working directory first on sys.path, so the checkout's copy is the one
  imported, as in TorchTitan's CI).

features.py reads RUNNER_TEMP (set on GitHub Actions) to put the model_only_hf_checkpoint load
path under the directory that holds run_tests.py's output_dir, `$RUNNER_TEMP/artifacts-to-be-uploaded`
in TorchTitan's CI workflow (.github/workflows/integration_test_8gpu_features.yaml). Its fallback
without RUNNER_TEMP, the relative `artifacts-to-be-uploaded/...`, is refused by TorchTitan's own
checkpointer ("initial_load_path must be an absolute path or a remote URI"), on a GPU too; so the
list is built for a RUNNER_TEMP (`build_features_test_list(runner_temp)`, the same code as
features.py's module level) and callers run as the CI does: RUNNER_TEMP=<workdir>, output_dir
<workdir>/artifacts-to-be-uploaded, from <workdir>.

The transcribed code is Copyright (c) Meta Platforms, Inc. and affiliates, all rights reserved,
under the BSD 3-Clause License of pytorch/torchtitan (text in TORCHTITAN_LICENSE below).
"""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.frameworks.torchtitan.assets import write_assets, write_sft_assets

COMMIT = "1fdf90d3f9b756ef709ce262bc839f1dab679b5e"
OUTPUT_DIR = "artifacts-to-be-uploaded"  # run_tests.py's output_dir in TorchTitan's CI: $RUNNER_TEMP/OUTPUT_DIR


# --- tests/integration_tests/__init__.py --------------------------------------------------------
# Copyright (c) Meta Platforms, Inc. and affiliates.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.
@dataclass
class OverrideDefinitions:
    """
    This class is used to define the override definitions for the integration tests.
    """

    override_args: Sequence[Sequence[str]] = tuple(tuple(" "))
    test_descr: str = "default"
    test_name: str = "default"
    ngpu: int = 4
    disabled: bool = False
    skip_rocm_test: bool = False
    timeout: int | None = None

    def __repr__(self):
        return self.test_descr


# --- tests/integration_tests/features.py ---------------------------------------------------------
# Copyright (c) Meta Platforms, Inc. and affiliates.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.
def _is_pp_only(variant: tuple[str, ...], ngpu: int) -> bool:
    """True when the variant has PP > 1 and no other SPMD parallelism > 1.

    SPMD backends require at least one SPMD axis > 1; PP-only runs collapse
    every dense SPMD axis to size 1 and trip DTensor's reshape / flatten
    rejection of Shard-on-degenerate-axis. Detected by parsing the explicit
    ``--parallelism.*_degree`` flags and back-computing ``dp_shard`` (default
    -1, "fill remaining").
    """
    degrees = {
        "pipeline_parallel_degree": 1,
        "data_parallel_replicate_degree": 1,
        "data_parallel_shard_degree": -1,
        "tensor_parallel_degree": 1,
        "context_parallel_degree": 1,
        "expert_parallel_degree": 1,
    }
    for arg in variant:
        for key in degrees:
            if key in arg:
                try:
                    degrees[key] = int(arg.split()[-1])
                except ValueError:
                    pass
                break
    if degrees["data_parallel_shard_degree"] == -1:
        denom = (
            degrees["pipeline_parallel_degree"]
            * degrees["data_parallel_replicate_degree"]
            * degrees["context_parallel_degree"]
            * degrees["tensor_parallel_degree"]
        )
        degrees["data_parallel_shard_degree"] = max(1, ngpu // denom)
    return degrees["pipeline_parallel_degree"] > 1 and all(
        v <= 1 for k, v in degrees.items() if k != "pipeline_parallel_degree"
    )


def _supports_spmd_typechecking(test_name: str, variant: tuple[str, ...]) -> bool:
    """List of tests/variants to test spmd_types backend, but without typechecking."""
    unsupported_tests = [
        # Compile is not compatible with SPMD typechecking yet.
        "1d_compile",
        "1d_compile_sac_op",
        "2d_compile",
        "2d_asynctp_compile",
        "3d_compile",
        "torchcomms_3d_dp+cp+pp+compile",
        "torchcomms_3d_dp+tp+pp+compile",
        # PP is not compatible with SPMD typechecking yet.
        "pp_dp_1f1b",
        "pp_tp_gpipe",
        "pp_dp_tp",
        "validation_tp_cp_pp",
        "float8_emulate_lora",
        # non-chunked CE loss isn't happy yet.
        (
            "2d_eager",
            [
                "--module llama3 --config llama3_debugmodel_ce_loss",
                "--parallelism.tensor_parallel_degree 2",
            ],
        ),
    ]
    return (
        test_name not in unsupported_tests
        and (test_name, variant) not in unsupported_tests
    )


def _configure_spmd_backend_and_typechecking(
    t: OverrideDefinitions,
) -> OverrideDefinitions:
    """Configure the spmd_types backend and enable typechecking where supported."""
    new_args = []
    for variant in t.override_args:
        prefix: list[str] = []
        suffix: list[str] = []
        has_cp = any("context_parallel_degree" in arg for arg in variant)
        has_compile = any("compile.enable" in arg for arg in variant)
        has_ac_mode = any("activation-checkpoint:" in arg for arg in variant)
        if (
            not _is_pp_only(variant, t.ngpu)
            and not (has_cp and has_compile)
            and not has_ac_mode
            and _supports_spmd_typechecking(t.test_name, variant)
        ):
            prefix.append("--debug.spmd_typechecking")
            suffix.append("activation-checkpoint:none")
        new_args.append(tuple(prefix) + tuple(variant) + tuple(suffix))
    return dataclasses.replace(
        t,
        override_args=tuple(new_args),
    )


def features_checkpoint_path(runner_temp: str | None) -> str:
    """features.py's module-level checkpoint_path, for a given RUNNER_TEMP (os.getenv there)."""
    # Use RUNNER_TEMP if defined (GitHub Actions variable), else fallback to old path
    if runner_temp:
        checkpoint_path = os.path.join(
            runner_temp,
            "artifacts-to-be-uploaded/model_only_hf_checkpoint/hf_checkpoint/step-10/",
        )
    else:
        checkpoint_path = (
            "artifacts-to-be-uploaded/model_only_hf_checkpoint/hf_checkpoint/step-10/"
        )
    return checkpoint_path


def _integration_tests_flavors(checkpoint_path: str) -> list[OverrideDefinitions]:
    """The list literal of features.py's build_features_test_list, as written."""
    integration_tests_flavors = [
        OverrideDefinitions(
            [
                [
                    "--profiler.enable_profiling",
                    "--metrics.enable_tensorboard",
                ],
            ],
            "default",
            "default",
        ),
        OverrideDefinitions(
            [
                [
                    "--compile.enable",
                ],
            ],
            "1D compile",
            "1d_compile",
        ),
        OverrideDefinitions(
            [
                [
                    "--compile.enable",
                    "activation-checkpoint:selective",
                ],
            ],
            "1D compile with selective op AC",
            "1d_compile_sac_op",
        ),
        OverrideDefinitions(
            [
                [
                    "--parallelism.tensor_parallel_degree 2",
                ],
                [
                    "--module llama3 --config llama3_debugmodel_ce_loss",
                    "--parallelism.tensor_parallel_degree 2",
                ],
            ],
            "2D eager (ChunkedLossWrapper + standard CE loss with TP+loss_parallel)",
            "2d_eager",
        ),
        OverrideDefinitions(
            [
                [
                    "--parallelism.tensor_parallel_degree 2",
                    "--parallelism.no-enable-sequence-parallel",
                ],
            ],
            "2D eager (SP disabled)",
            "2d_eager_no_sp",
        ),
        OverrideDefinitions(
            [
                [
                    "--compile.enable",
                    "--parallelism.tensor_parallel_degree 2",
                ],
            ],
            "2D compile",
            "2d_compile",
        ),
        # TODO: re-enable this test once the async TP CI issue is fixed
        OverrideDefinitions(
            [
                [
                    "--compile.enable",
                    "--parallelism.tensor_parallel_degree 2",
                    "--compile.enable_async_tensor_parallel",
                ],
            ],
            "2D async TP compile",
            "2d_asynctp_compile",
            disabled=True,
        ),
        OverrideDefinitions(
            [
                [
                    "--checkpoint.enable",
                ],
                [
                    "--checkpoint.enable",
                    "--training.steps 20",
                ],
            ],
            "Checkpoint Integration Test - Save Load Full Checkpoint",
            "full_checkpoint",
        ),
        OverrideDefinitions(
            [
                [
                    "--checkpoint.enable",
                    "--checkpoint.folder hf_checkpoint",
                    "--checkpoint.last_save_model_only",
                    "--checkpoint.last_save_in_hf",
                ],
                [
                    "--checkpoint.enable",
                    f"--checkpoint.initial_load_path {checkpoint_path}",
                    "--checkpoint.initial_load_model_only",
                    "--checkpoint.initial_load_in_hf",
                ],
            ],
            "Checkpoint Integration Test - save load model only checkpoint in HF definition and format",
            "model_only_hf_checkpoint",
        ),
        OverrideDefinitions(
            [
                [
                    "--checkpoint.enable",
                    "--checkpoint.last_save_model_only",
                    "--checkpoint.export_dtype bfloat16",
                ],
            ],
            "Checkpoint Integration Test - Save Model Only bf16",
            "last_save_model_only_bf16",
        ),
        OverrideDefinitions(
            [
                [
                    "--training.disable_cuda_graphs",
                    "--parallelism.pipeline_parallel_degree 2",
                    "--parallelism.pipeline_parallel_schedule 1F1B",
                    "--parallelism.data_parallel_shard_degree 1",
                ],
            ],
            "PP 1D test 1F1B",
            "pp_1f1b",
            ngpu=2,
        ),
        OverrideDefinitions(
            [
                [
                    "--training.disable_cuda_graphs",
                    "--parallelism.pipeline_parallel_degree 2",
                    "--parallelism.pipeline_parallel_schedule 1F1B",
                    "--parallelism.data_parallel_shard_degree 2",
                ],
                [
                    "--training.disable_cuda_graphs",
                    "--parallelism.pipeline_parallel_degree 2",
                    "--parallelism.pipeline_parallel_schedule 1F1B",
                    "--parallelism.pipeline_parallel_layers_per_stage 4",
                    "--parallelism.data_parallel_shard_degree 2",
                ],
            ],
            "PP+DP 1F1B 2D test",
            "pp_dp_1f1b",
        ),
        OverrideDefinitions(
            [
                [
                    "--training.disable_cuda_graphs",
                    "--parallelism.pipeline_parallel_degree 2",
                    "--parallelism.pipeline_parallel_schedule GPipe",
                    "--parallelism.tensor_parallel_degree 2",
                ],
            ],
            "PP+TP GPipe 2D test",
            "pp_tp_gpipe",
        ),
        OverrideDefinitions(
            [
                [
                    "--training.disable_cuda_graphs",
                    "--checkpoint.enable",
                    "--parallelism.pipeline_parallel_degree 2",
                    "--parallelism.data_parallel_shard_degree 2",
                    "--parallelism.tensor_parallel_degree 2",
                ],
                [
                    "--training.disable_cuda_graphs",
                    "--training.steps 20",
                    "--checkpoint.enable",
                    "--parallelism.pipeline_parallel_degree 2",
                    "--parallelism.data_parallel_shard_degree 2",
                    "--parallelism.tensor_parallel_degree 2",
                ],
            ],
            "PP+DP+TP 3D test with save/load resume ckpt",
            "pp_dp_tp",
            ngpu=8,
        ),
        OverrideDefinitions(
            [
                [
                    "--training.disable_cuda_graphs",
                    "--parallelism.pipeline_parallel_degree 2",
                    "--parallelism.data_parallel_shard_degree 2",
                    "--parallelism.tensor_parallel_degree 2",
                    "--compile.enable",
                ],
            ],
            "PP+DP+TP 3D test with torch.compile",
            "3d_compile",
            ngpu=8,
        ),
        OverrideDefinitions(
            [
                [
                    "--training.disable_cuda_graphs",
                    "--parallelism.pipeline_parallel_degree 4",
                    "--parallelism.pipeline_parallel_schedule Interleaved1F1B",
                ],
                [
                    "--training.disable_cuda_graphs",
                    "--parallelism.pipeline_parallel_degree 4",
                    "--parallelism.pipeline_parallel_schedule Interleaved1F1B",
                    "--parallelism.pipeline_parallel_layers_per_stage 1",
                ],
            ],
            "PP looped 1F1B test",
            "pp_looped_1f1b",
            ngpu=4,
        ),
        # (features.py: disabled with the FlexAttention default; zero-bubble / multi schedules
        # split backward and stage_backward_input chokes on the forwarded BlockMask)
        OverrideDefinitions(
            [
                [
                    "--training.disable_cuda_graphs",
                    "--parallelism.pipeline_parallel_degree 4",
                    "--parallelism.pipeline_parallel_schedule InterleavedZeroBubble",
                    "activation-checkpoint:full",
                ],
            ],
            "PP looped zero bubble test",
            "pp_looped_zero_bubble",
            ngpu=4,
            disabled=True,
        ),
        OverrideDefinitions(
            [
                [
                    "--training.disable_cuda_graphs",
                    "--parallelism.pipeline_parallel_degree 2",
                    "--parallelism.pipeline_parallel_schedule ZBVZeroBubble",
                    "activation-checkpoint:full",
                ],
            ],
            "PP zero bubble test (v shaped)",
            "pp_zbv",
            ngpu=2,
            disabled=True,
        ),
        # (features.py: disabled for the same reason as the zero-bubble PP tests above)
        OverrideDefinitions(
            [
                [
                    "--training.disable_cuda_graphs",
                    "--parallelism.pipeline_parallel_degree 2",
                    "--parallelism.pipeline_parallel_schedule PipelineScheduleMulti",
                    "--parallelism.pipeline_parallel_schedule_csv ./tests/assets/custom_schedule.csv",
                    "activation-checkpoint:full",
                ],
            ],
            "PP with custom pipeline schedule loaded from CSV file",
            "pp_custom_csv",
            ngpu=2,
            disabled=True,
        ),
        OverrideDefinitions(
            [
                [
                    "--optimizer.implementation fused_opt_states_bf16",
                ]
            ],
            "BF16 Optimizer States Test",
            "optimizer_bf16_states",
            ngpu=2,
        ),
        OverrideDefinitions(
            [
                [
                    "--parallelism.data_parallel_shard_degree=1",
                    "--parallelism.data_parallel_replicate_degree=4",
                ]
            ],
            "DDP",
            "ddp",
            ngpu=4,
        ),
        OverrideDefinitions(
            [
                [
                    "--parallelism.data_parallel_shard_degree=2",
                    "--parallelism.data_parallel_replicate_degree=2",
                ]
            ],
            "HSDP",
            "hsdp",
            ngpu=4,
        ),
        OverrideDefinitions(
            [
                [
                    "--parallelism.context_parallel_degree=4",
                ]
            ],
            "CP",
            "cp",
            ngpu=4,
        ),
        OverrideDefinitions(
            [
                [
                    "--parallelism.data_parallel_shard_degree=2",
                    "--parallelism.data_parallel_replicate_degree=2",
                    "--parallelism.tensor_parallel_degree=2",
                ]
            ],
            "HSDP+TP",
            "hsdp+tp",
            ngpu=8,
        ),
        OverrideDefinitions(
            [
                [
                    "--module torchtitan_recipes.tests "
                    "--config llama3_debugmodel_fsdp2_cp2",
                ]
            ],
            "FSDP+CP",
            "fsdp+cp",
            ngpu=4,
        ),
        OverrideDefinitions(
            [
                [
                    "--parallelism.data_parallel_shard_degree=1",
                    "--parallelism.data_parallel_replicate_degree=2",
                    "--parallelism.context_parallel_degree=2",
                ]
            ],
            "HSDP+CP (without dp_shard)",
            "hsdp+cp_without_dp_shard",
            ngpu=4,
        ),
        OverrideDefinitions(
            [
                [
                    "--parallelism.data_parallel_shard_degree=2",
                    "--parallelism.data_parallel_replicate_degree=2",
                    "--parallelism.context_parallel_degree=2",
                ]
            ],
            "HSDP+CP (with dp_shard)",
            "hsdp+cp_with_dp_shard",
            ngpu=8,
        ),
        OverrideDefinitions(
            [
                [
                    "--parallelism.data_parallel_shard_degree=2",
                    "--parallelism.tensor_parallel_degree=2",
                    "--parallelism.context_parallel_degree=2",
                ]
            ],
            "FSDP+TP+CP",
            "fsdp+tp+cp",
            ngpu=8,
        ),
        OverrideDefinitions(
            [
                [
                    "--parallelism.fsdp_reshard_after_forward always",
                ],
            ],
            "Test always resharding after forward pass",
            "fsdp_reshard_always",
            ngpu=2,
        ),
        OverrideDefinitions(
            [
                [
                    "--checkpoint.enable",
                    "--training.steps 10",
                ],
                # Save at [dp:4] and load at [dp:2, tp:2]. Note that the dataloader should be
                # excluded during loading to avoid errors caused by mismatched dp_degree.
                [
                    "--checkpoint.enable",
                    "--checkpoint.exclude_from_loading lr_scheduler,dataloader,optimizer",
                    "--parallelism.tensor_parallel_degree 2",
                    "--training.steps 20",
                ],
            ],
            "Optional checkpoint",
            "optional_checkpoint",
        ),
        OverrideDefinitions(
            [
                [
                    # Local batch size = 8, and `ngpu=2`, so default
                    # global batch size = 8 * 2 = 16.
                    # To achieve 2 gradient accumulation steps, multiply
                    # default global batch size by 2. 16 * 2 = 32.
                    "--training.local_batch_size 8",
                    "--training.global_batch_size 32",
                ],
            ],
            "Gradient accumulation",
            "gradient_accumulation",
            ngpu=2,
        ),
        OverrideDefinitions(
            [
                [
                    "--training.disable_cuda_graphs",
                    "--validator.enable",
                    "--validator.dataloader.dataset c4_test",
                    "--parallelism.tensor_parallel_degree=2",
                    "--parallelism.context_parallel_degree=2",
                    "--parallelism.pipeline_parallel_degree=2",
                    "--parallelism.pipeline_parallel_schedule Interleaved1F1B",
                ],
            ],
            "Validation test with tp, cp, pp",
            "validation_tp_cp_pp",
            ngpu=8,
        ),
        OverrideDefinitions(
            [
                [
                    "--override.imports torchtitan.overrides.fused_swiglu.fused_swiglu",
                    "--parallelism.tensor_parallel_degree 2",
                ],
            ],
            "Override: swap FeedForward with fused SwiGLU (FSDP2 + TP2)",
            "override_fused_swiglu",
            ngpu=4,
        ),
        OverrideDefinitions(
            [
                [
                    "--training.disable_cuda_graphs",
                    "--module deepseek_v3 --config deepseek_v3_debugmodel",
                    "--override.imports torchtitan.overrides.fused_swiglu.fused_swiglu,"
                    "torchtitan.overrides.fused_swiglu.fused_grouped_experts",
                    "--parallelism.tensor_parallel_degree 2",
                    "--parallelism.expert_parallel_degree 4",
                ],
            ],
            "Override: fuse grouped experts + FFNs on deepseek_v3 "
            "(FSDP2 + TP2 dense, EP4 sparse)",
            "override_fused_grouped_experts",
            ngpu=4,
        ),
        # NOTE: below are tests which require config change that cannot be done
        #       via CLI overrides, so remain llama3 specific
        OverrideDefinitions(
            [
                [
                    "--training.disable_cuda_graphs",
                    "--module llama3 --config llama3_debugmodel_varlen_attn",
                    "--parallelism.data_parallel_shard_degree=4",
                    "activation-checkpoint:selective",
                ]
            ],
            "FSDP+VARLEN_ATTN + per op SAC",
            "fsdp+varlen_attn+per_op_sac",
            ngpu=4,
            skip_rocm_test=True,
        ),
        OverrideDefinitions(
            [
                [
                    "--training.disable_cuda_graphs",
                    "--module llama3 --config llama3_debugmodel_float8_emulate_lora",
                    "--parallelism.tensor_parallel_degree 2",
                    "--parallelism.pipeline_parallel_degree 2",
                ],
            ],
            "Float8 emulate + LoRA training test",
            "float8_emulate_lora",
            ngpu=8,
        ),
        OverrideDefinitions(
            [
                [
                    "--training.disable_cuda_graphs",
                    "--comm.mode torchcomms",
                    "--parallelism.context_parallel_degree 2",
                    "--parallelism.pipeline_parallel_degree 2",
                    "--compile.enable",
                ],
            ],
            "FSDP+CP+PP+compile with torchcomms",
            "torchcomms_3d_dp+cp+pp+compile",
            ngpu=8,
            skip_rocm_test=True,
            # NotImplementedError: new_group cannot delegate to split_group
            # with use_local_synchronization=True; split_group requires all
            # ranks in the parent group to participate.
            disabled=True,
        ),
        OverrideDefinitions(
            [
                [
                    "--training.disable_cuda_graphs",
                    "--module llama3 --config llama3_debugmodel_ce_loss",
                    "--comm.mode torchcomms",
                    "--parallelism.tensor_parallel_degree 2",
                    "--parallelism.pipeline_parallel_degree 2",
                    "--compile.enable",
                ],
            ],
            "FSDP+TP+PP+compile with torchcomms",
            "torchcomms_3d_dp+tp+pp+compile",
            ngpu=8,
            skip_rocm_test=True,
            # torchcomms-managed TP PG not registered in c10d;
            # resolve fails under compile
            disabled=True,
        ),
        OverrideDefinitions(
            [
                [
                    "--module llama3 --config sft_debugmodel",
                ],
            ],
            "SFT ChatDataset integration test",
            "sft",
            ngpu=2,
        ),
        OverrideDefinitions(
            [
                [
                    "--training.disable_cuda_graphs",
                    "--checkpoint.enable",
                    "--checkpoint.create_seed_checkpoint",
                ],
            ],
            "Seed checkpoint creation",
            "seed_checkpoint",
            ngpu=1,
            timeout=30,
        ),
    ]
    return integration_tests_flavors


def build_features_test_list(runner_temp: str | None = None) -> list[OverrideDefinitions]:
    """features.py's build_features_test_list (every entry through the spmd transform), as
    imported with RUNNER_TEMP=runner_temp."""
    return [
        *[
            _configure_spmd_backend_and_typechecking(t)
            for t in _integration_tests_flavors(features_checkpoint_path(runner_temp))
        ],
    ]


# --- tests/integration_tests/run_tests.py ---------------------------------------------------------
def runnable_tests(runner_temp: str | None = None) -> list[OverrideDefinitions]:
    """`_filter_tests` with --test_name all, --ngpu 8 (TorchTitan's CI), --gpu_arch_type cuda:
    every test not disabled (none needs more than 8 GPUs)."""
    return [t for t in build_features_test_list(runner_temp) if not t.disabled]


def command(test_flavor: OverrideDefinitions, override_arg: Sequence[str], output_dir: str) -> str:
    """The shell command run_single_test runs for one variant (sequential mode, MODULE/CONFIG not
    set), from the repository root, with `shell=True` and `timeout=test_flavor.timeout`."""
    test_name = test_flavor.test_name
    dump_folder_arg = f"--dump_folder {output_dir}/{test_name}"
    all_ranks = ",".join(map(str, range(test_flavor.ngpu)))
    cmd = f"NGPU={test_flavor.ngpu} LOG_RANK={all_ranks} ./run_train.sh"
    # dump compile trace for debugging purpose
    cmd = f'TORCH_TRACE="{output_dir}/{test_name}/compile_trace" ' + cmd
    cmd += " " + dump_folder_arg
    if override_arg:
        cmd += " " + " ".join(override_arg)
    return cmd


# --- run_train.sh, torchtitan_recipes/ -------------------------------------------------------------
RUN_TRAIN_SH = r'''#!/usr/bin/bash
# Copyright (c) Meta Platforms, Inc. and affiliates.
# All rights reserved.

# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

set -ex

# use envs as local overwrites for convenience
# e.g.
# LOG_RANK=0,1 NGPU=4 ./run_train.sh
#
# COMM_MODE options for debugging:
#
# 1. "fake_backend" - Dry-run mode for config validation without GPU execution
#    - Uses fake process groups (no actual communication)
#    - Runs on a single GPU without torchrun or NCCL initialization
#    - Useful for validating configuration and model setup
#    Example: NGPU=32 COMM_MODE="fake_backend" ./run_train.sh
#    Set RANK to simulate a nonzero global rank, for example RANK=16.
#
# 2. "local_tensor" - Single-GPU debugging mode with simulated multi-GPU behavior
#    - All communication and computation execute on a single shared GPU
#    - Simulates the full training workflow without actual distributed communication
#    - Useful for debugging distributed training logic locally
#    Example: NGPU=32 COMM_MODE="local_tensor" ./run_train.sh

NGPU=${NGPU:-"8"}
export LOG_RANK=${LOG_RANK:-0}
MODULE=${MODULE:-"llama3"}
CONFIG=${CONFIG:-"llama3_debugmodel"}
COMM_MODE=${COMM_MODE:-""}

TORCHFT_LIGHTHOUSE=${TORCHFT_LIGHTHOUSE:-"http://localhost:29510"}

if [ -n "$COMM_MODE" ]; then
    # Communication mode specified: validate configuration or run in debug mode
    echo "Running with comm_mode=${COMM_MODE}"
    NGPU="${NGPU}" LOCAL_RANK=0 python3 -m torchtitan.train --module ${MODULE} --config ${CONFIG} "$@" --comm.mode=${COMM_MODE} --training.steps 1
else
    # Normal training with torchrun
    PYTORCH_ALLOC_CONF="expandable_segments:True" \
    TORCHFT_LIGHTHOUSE=${TORCHFT_LIGHTHOUSE} \
    torchrun --nproc_per_node=${NGPU} --rdzv_backend c10d --rdzv_endpoint="localhost:0" \
    --local-ranks-filter ${LOG_RANK} --role rank --tee 3 \
    -m torchtitan.train --module ${MODULE} --config ${CONFIG} "$@"
fi
'''

RECIPES_INIT_PY = '''# Copyright (c) Meta Platforms, Inc. and affiliates.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""See ``torchtitan/config/README.md``"""
'''

RECIPES_TESTS_PY = '''# Copyright (c) Meta Platforms, Inc. and affiliates.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""Full configurations backing the integration tests.

Each function here is one entry in ``tests/integration_tests``, expressed as
a configuration instead of a base config plus command-line flags. Keeping
them in this package rather than in the test files means CI exercises the
same selection path users do.

Unrelated to the repository's top-level ``tests/`` package, which holds the
test code itself.
"""

from torchtitan.models.llama3.config_registry import llama3_debugmodel
from torchtitan.trainer import Trainer


def llama3_debugmodel_fsdp2_cp2() -> Trainer.Config:
    """Debug model on 4 GPUs: FSDP 2, context parallel 2.

    Derives from ``llama3_debugmodel`` so the two cannot drift, and pins the
    parallelism the run needs instead of leaving it to the command line, so
    the configuration name is enough to reproduce it.
    """
    config = llama3_debugmodel()
    config.parallelism.data_parallel_shard_degree = 2
    config.parallelism.context_parallel_degree = 2
    return config
'''

TORCHTITAN_LICENSE = """BSD 3-Clause License

(c) Meta Platforms, Inc. and affiliates.

Redistribution and use in source and binary forms, with or without modification,
are permitted provided that the following conditions are met:

1. Redistributions of source code must retain the above copyright notice,this list
of conditions and the following disclaimer.

2. Redistributions in binary form must reproduce the above copyright notice, this
list of conditions and the following disclaimer in the documentation
and/or other materials provided with the distribution.

3. Neither the name of the copyright holder nor the names of its contributors may
be used to endorse or promote products derived from this software without specific
prior written permission.

THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS \u201cAS IS\u201d AND ANY
EXPRESS OR IMPLIED WARRANTIES, INCLUDING, BUT NOT LIMITED TO, THE IMPLIED WARRANTIES
OF MERCHANTABILITY AND FITNESS FOR A PARTICULAR PURPOSE ARE DISCLAIMED. IN NO EVENT
SHALL THE COPYRIGHT HOLDER OR CONTRIBUTORS BE LIABLE FOR ANY DIRECT, INDIRECT,
INCIDENTAL, SPECIAL, EXEMPLARY, OR CONSEQUENTIAL DAMAGES (INCLUDING, BUT NOT LIMITED
TO, PROCUREMENT OF SUBSTITUTE GOODS OR SERVICES; LOSS OF USE, DATA, OR PROFITS; OR
BUSINESS INTERRUPTION) HOWEVER CAUSED AND ON ANY THEORY OF LIABILITY, WHETHER IN
CONTRACT, STRICT LIABILITY, OR TORT (INCLUDING NEGLIGENCE OR OTHERWISE) ARISING IN
ANY WAY OUT OF THE USE OF THIS SOFTWARE, EVEN IF ADVISED OF THE POSSIBILITY OF SUCH
DAMAGE.
"""


def write_checkout(root: Path) -> None:
    """What a torchtitan checkout's root holds for these tests, written into root: run_train.sh
    (executable), torchtitan_recipes/{__init__,tests}.py, and the stand-in assets
    tests/assets/{tokenizer,c4_test,sft_test} (assets.py; the wheel ships none)."""
    root.mkdir(parents=True, exist_ok=True)
    script = root / "run_train.sh"
    script.write_text(RUN_TRAIN_SH)
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    recipes = root / "torchtitan_recipes"
    recipes.mkdir(exist_ok=True)
    (recipes / "__init__.py").write_text(RECIPES_INIT_PY)
    (recipes / "tests.py").write_text(RECIPES_TESTS_PY)
    (root / "LICENSE.torchtitan").write_text(TORCHTITAN_LICENSE)
    write_assets(root)
    write_sft_assets(root)
    (root / OUTPUT_DIR).mkdir(exist_ok=True)


__all__ = ["COMMIT", "OUTPUT_DIR", "OverrideDefinitions", "build_features_test_list", "command", "features_checkpoint_path",
           "runnable_tests", "write_checkout"]
