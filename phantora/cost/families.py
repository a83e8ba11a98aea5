"""Which model times each op: the one table from aten op name to op family.

`classify(name, tags)` answers for a qualified op name ("aten::mm") and the overload's tags.
Order of the rules:
  1. namespaces other than aten: FSDP2's copy ops, the flex-attention higher-order ops and the
     stand-ins for CUDA extensions (FusedAdam, FlashAttention 3) by qualified name
     (QUALIFIED_FAMILIES),
     prim/profiler ops are host-only, collectives belong to the network model, anything
     else is unknown;
  2. the explicit table below (by op name, then by its in-place / functional twin), and the
     "_foreach_" prefix -> multi-tensor apply;
  3. the deliberate UNMODELLED set and the ops of other backends or layouts
     (FOREIGN_PREFIXES / FOREIGN_OPS): a Family with modelled=False, timed by the generic
     fallback and reported as unknown;
  4. tags: "view"/"inplace_view" -> no GPU work, "view_copy" -> a copy kernel,
     "reduction" -> reduce kernel, "pointwise" -> elementwise kernel,
     "nondeterministic_seeded" -> RNG kernel;
  5. anything else: None (unknown: the fallback, and the caller reports it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from phantora.cost import apex, attention, conv, copies, fused, gemm, indexing, losses, movement, normalization
from phantora.cost import optimizers, pointwise, recurrent, reductions, spectral
from phantora.cost import transformer_engine
from phantora.cost.roofline import CostContext, OpCost
from phantora.ops import OpSignature

Model = Callable[[OpSignature, CostContext], OpCost]


@dataclass(frozen=True, slots=True)
class Family:
    name: str  # what summaries group by: "gemm", "attention", "pointwise", "view", ...
    model: Model | None  # None: the op launches no GPU work (host cost only)
    modelled: bool = True  # False: deliberately left to the generic fallback, reported unknown


# Families without GPU work.
VIEW = Family("view", None)
ALLOCATION = Family("allocation", None)  # allocates (or resizes) without launching a kernel
HOST = Family("host", None)  # runs on the CPU only: metadata queries, asserts on symbols, profiler
COLLECTIVE = Family("collective", None)  # c10d: timed by phantora/net, not by a kernel estimator
FOREIGN = Family("foreign", None, modelled=False)  # other backends/layouts: never on a CUDA tensor
UNMODELLED = Family("unmodelled", None, modelled=False)

NAMESPACE_FAMILIES = {
    "prim": HOST,
    "profiler": HOST,
    "c10d": COLLECTIVE,
    "_c10d_functional": COLLECTIVE,
    "_c10d_functional_autograd": COLLECTIVE,
    "c10d_functional": COLLECTIVE,
    "_dtensor": COLLECTIVE,
    "symm_mem": COLLECTIVE,
    "triton": Family("fused", fused.triton_kernel),  # kernels torch.compile generates
    "triton_user": Family("user_triton", fused.user_triton_kernel),  # kernel[grid](...) launched by the program
}


def _table(family: str, model: Model, names: str) -> dict[str, Family]:
    """{op name: Family(family, model)} for the whitespace-separated op names."""
    return _ops(Family(family, model), names)


def _ops(family: Family, names: str) -> dict[str, Family]:
    return {n: family for n in names.split()}


FOREACH = Family("foreach", optimizers.foreach)
VIEW_COPY = Family("movement", movement.copy_like)
REDUCTION = Family("reduction", reductions.reduction)
POINTWISE = Family("pointwise", pointwise.pointwise)
RNG = Family("rng", pointwise.rng)

OP_FAMILIES: dict[str, Family] = {
    # --- matrix products (gemm.py)
    **_table("gemm", gemm.mm, "mm _int_mm"),
    **_table("gemm", gemm.addmm, "addmm _addmm_activation"),
    **_table("gemm", gemm.bmm, "bmm"),
    **_table("gemm", gemm.baddbmm, "baddbmm addbmm"),
    **_table("gemm", gemm.matrix_vector, "mv addmv dot vdot addr"),
    **_table("gemm", gemm.scaled_mm, "_scaled_mm _scaled_mm_v2"),
    **_table("gemm", gemm.grouped_mm, "_grouped_mm _scaled_grouped_mm _scaled_grouped_mm_v2"),
    **_table("gemm", gemm.weight_only_quant_mm,
             "_weight_int4pack_mm _weight_int8pack_mm _weight_int4pack_mm_with_scales_and_zeros"),
    **_table("gemm", gemm.linear, "linear"),
    **_table("gemm", gemm.linear_backward, "linear_backward"),
    **_table("gemm", gemm.pairwise_distance, "_cdist_forward _cdist_backward _euclidean_dist"),
    # --- attention (attention.py)
    **_table("attention", attention.attention, """
        _scaled_dot_product_flash_attention _scaled_dot_product_flash_attention_backward
        _scaled_dot_product_efficient_attention _scaled_dot_product_efficient_attention_backward
        _scaled_dot_product_cudnn_attention _scaled_dot_product_cudnn_attention_backward
        _scaled_dot_product_fused_attention_overrideable
        _scaled_dot_product_fused_attention_overrideable_backward
        _flash_attention_forward _flash_attention_backward
        _efficient_attention_forward _efficient_attention_backward
        _cudnn_attention_forward _cudnn_attention_backward
        _flash_attention_forward_no_dropout_inplace"""),
    # --- convolution (conv.py)
    **_table("conv", conv.convolution, """
        convolution _convolution convolution_overrideable cudnn_convolution
        cudnn_convolution_transpose cudnn_convolution_relu cudnn_convolution_add_relu
        _slow_conv2d_forward slow_conv3d_forward slow_conv_dilated2d slow_conv_dilated3d
        slow_conv_transpose2d slow_conv_transpose3d conv_depthwise3d _conv_depthwise2d conv_tbc"""),
    **_table("conv", conv.convolution_backward,
             "convolution_backward convolution_backward_overrideable _slow_conv2d_backward"),
    # --- normalization and softmax (normalization.py)
    **_table("norm", normalization.layer_norm, "native_layer_norm _fused_rms_norm"),
    **_table("norm", normalization.layer_norm_backward, "native_layer_norm_backward _fused_rms_norm_backward"),
    **_table("norm", normalization.batch_norm, """
        native_batch_norm _native_batch_norm_legit _native_batch_norm_legit_functional
        _native_batch_norm_legit_no_training cudnn_batch_norm _batch_norm_with_update
        _batch_norm_with_update_functional _batch_norm_no_update"""),
    **_table("norm", normalization.batch_norm_backward,
             "native_batch_norm_backward cudnn_batch_norm_backward batch_norm_backward"),
    **_table("norm", normalization.sync_batch_norm_piece, """
        batch_norm_stats batch_norm_elemt batch_norm_backward_reduce batch_norm_backward_elemt
        batch_norm_gather_stats batch_norm_gather_stats_with_counts batch_norm_update_stats"""),
    **_table("norm", normalization.group_norm, "native_group_norm"),
    **_table("norm", normalization.group_norm_backward, "native_group_norm_backward"),
    **_table("norm", normalization.weight_norm, "_weight_norm_interface _weight_norm_interface_backward"),
    **_table("softmax", normalization.softmax,
             "_softmax _log_softmax _safe_softmax _masked_softmax softmax log_softmax"),
    **_table("softmax", normalization.softmax_backward,
             "_softmax_backward_data _log_softmax_backward_data _masked_softmax_backward"),
    # --- elementwise ops that carry no "pointwise" tag (pointwise.py)
    **_ops(POINTWISE, """
        masked_fill _add_relu _prelu_kernel _prelu_kernel_backward _masked_scale
        _thnn_fused_lstm_cell _thnn_fused_lstm_cell_backward_impl _thnn_fused_gru_cell
        _thnn_fused_gru_cell_backward _dirichlet_grad _standard_gamma_grad polar complex
        _conj_physical conj_physical hardtanh_backward elu_backward log_sigmoid_forward
        log_sigmoid_backward softplus_backward leaky_relu_backward mish_backward
        hardswish_backward hardsigmoid_backward softshrink_backward hardshrink_backward
        glu glu_backward glu_jvp glu_backward_jvp logit_backward rrelu_with_noise_backward
        fake_quantize_per_tensor_affine_cachemask fake_quantize_per_channel_affine_cachemask
        _fake_quantize_per_tensor_affine_cachemask_tensor_qparams
        _fake_quantize_learnable_per_tensor_affine _fake_quantize_learnable_per_channel_affine
        _fake_quantize_learnable_per_tensor_affine_backward
        _fake_quantize_learnable_per_channel_affine_backward linalg_cross
        _transform_bias_rescale_qkv isin
        __irshift__ __ilshift__ __lshift__ __rshift__ __or__ __ior__ __and__ __iand__ __xor__ __ixor__
        abs add sub mul div rsub remainder
        floor_divide copysign gcd lcm heaviside xlogy bitwise_and bitwise_or bitwise_xor
        bitwise_left_shift bitwise_right_shift eq ne lt le gt ge isinf isnan where relu
        threshold threshold_backward gelu gelu_backward celu elu leaky_relu hardtanh
        hardshrink softshrink hardsigmoid hardswish mish softplus native_dropout_backward"""),
    **_table("fill", pointwise.fill, """
        fill zero zeros zeros_like ones ones_like full full_like new_full new_zeros new_ones
        scalar_tensor arange range linspace logspace eye tril_indices triu_indices
        bartlett_window blackman_window hamming_window hann_window kaiser_window
        fft_fftfreq fft_rfftfreq _new_zeros_with_same_feature_meta"""),
    **_ops(RNG, """
        normal normal_functional uniform bernoulli random exponential cauchy log_normal
        geometric rand rand_like randn randn_like randint randint_like multinomial poisson
        binomial _standard_gamma _sample_dirichlet _philox_normal _philox_uniform
        _philox_key_split _philox_key_fold_in rrelu_with_noise rrelu_with_noise_functional
        _cudnn_init_dropout_state _fill_mem_eff_dropout_mask"""),
    **_table("rng", pointwise.randperm, "randperm"),
    **_table("rng", pointwise.dropout, "native_dropout _fused_dropout"),
    **_table("scalar", pointwise.tiny_kernel, "_assert_async _functional_assert_async _amp_update_scale"),
    # --- reductions, scans, sorting (reductions.py); most reductions are found by their tag
    **_ops(REDUCTION, """
        native_norm linalg__powsum dist trace var_mean std_mean _aminmax _is_all_true
        _is_any_true allclose equal hash_tensor _fused_moving_avg_obs_fq_helper sum prod norm
        count_nonzero
        _fused_moving_avg_obs_fq_helper_functional segment_reduce _segment_reduce_backward"""),
    **_table("reduction", reductions.two_pass_reduction, "logsumexp renorm embedding_renorm"),
    **_table("scan", reductions.scan,
             "cumsum cumprod logcumsumexp _logcumsumexp cummax cummin _cummax_helper _cummin_helper"),
    **_table("sort", reductions.sort, "sort argsort"),
    **_table("sort", reductions.topk, "topk"),
    **_table("sort", reductions.median_like, "median nanmedian mode kthvalue"),
    **_table("sort", reductions.unique, "_unique _unique2 unique_consecutive unique_dim unique_dim_consecutive"),
    **_table("reduction", reductions.histogram, """
        bincount histc histogram _histogramdd_bin_edges _histogramdd_from_bin_cts
        _histogramdd_from_bin_tensors"""),
    **_table("indexing", reductions.nonzero, "nonzero nonzero_static masked_select argwhere masked_scatter_backward"),
    **_table("indexing", reductions.searchsorted, "searchsorted bucketize"),
    # --- embedding, gather/scatter, cat (indexing.py)
    **_table("indexing", indexing.gather, """
        embedding index _unsafe_index index_select gather take _unsafe_masked_index
        _embedding_bag_per_sample_weights_backward"""),
    **_table("indexing", indexing.embedding_bag, "_embedding_bag _embedding_bag_forward_only"),
    **_table("indexing", indexing.embedding_backward,
             "embedding_dense_backward _embedding_bag_backward _embedding_bag_dense_backward"),
    **_table("indexing", indexing.index_put, "index_put _index_put_impl _unsafe_index_put"),
    **_table("indexing", indexing.scatter, """
        scatter scatter_add scatter_reduce index_add index_copy index_fill index_reduce put
        _unsafe_masked_index_put_accumulate"""),
    **_table("indexing", indexing.masked_scatter, "masked_scatter"),
    **_table("cat", indexing.cat, "cat stack _stack _chunk_cat"),
    **_table("indexing", indexing.generic_memory, "_pack_padded_sequence _cudnn_rnn_flatten_weight"),
    # --- data movement (movement.py)
    **_ops(VIEW_COPY, """
        flip roll repeat repeat_interleave tril triu constant_pad_nd reflection_pad1d
        reflection_pad2d reflection_pad3d replication_pad1d replication_pad2d replication_pad3d
        upsample_nearest1d upsample_nearest2d upsample_nearest3d upsample_linear1d
        upsample_bilinear2d upsample_bicubic2d upsample_trilinear3d _upsample_nearest_exact1d
        _upsample_nearest_exact2d _upsample_nearest_exact3d _upsample_bilinear2d_aa
        _upsample_bicubic2d_aa _upsample_lanczos2d_aa pixel_shuffle pixel_unshuffle
        channel_shuffle native_channel_shuffle im2col col2im diag_embed rot90 narrow_copy
        _reshape_copy block_diag _convert_weight_to_int4pack affine_grid_generator
        grid_sampler_2d grid_sampler_3d
        avg_pool1d avg_pool2d avg_pool3d adaptive_avg_pool1d _adaptive_avg_pool2d
        _adaptive_avg_pool3d adaptive_avg_pool2d adaptive_avg_pool3d adaptive_max_pool2d
        adaptive_max_pool3d fractional_max_pool2d fractional_max_pool3d max_unpool2d
        max_unpool3d _jagged_to_padded_dense_forward _padded_dense_to_jagged_forward
        cudnn_affine_grid_generator cudnn_grid_sampler
        _compute_linear_combination"""),
    **_table("movement", movement.max_pool, "max_pool2d_with_indices max_pool3d_with_indices"),
    **_table("movement", movement.max_pool_backward,
             "max_pool2d_with_indices_backward max_pool3d_with_indices_backward"),
    **_table("movement", movement.pool_backward, """
        adaptive_max_pool2d_backward adaptive_max_pool3d_backward fractional_max_pool2d_backward
        fractional_max_pool3d_backward avg_pool2d_backward avg_pool3d_backward
        _adaptive_avg_pool2d_backward _adaptive_avg_pool3d_backward adaptive_avg_pool3d_backward
        reflection_pad1d_backward reflection_pad2d_backward reflection_pad3d_backward
        replication_pad1d_backward replication_pad2d_backward replication_pad3d_backward
        upsample_nearest1d_backward upsample_nearest2d_backward upsample_nearest3d_backward
        upsample_linear1d_backward upsample_bilinear2d_backward upsample_bicubic2d_backward
        upsample_trilinear3d_backward _upsample_nearest_exact1d_backward
        _upsample_nearest_exact2d_backward _upsample_nearest_exact3d_backward
        _upsample_bilinear2d_aa_backward _upsample_bicubic2d_aa_backward
        _upsample_lanczos2d_aa_backward grid_sampler_2d_backward grid_sampler_3d_backward
        cudnn_affine_grid_generator_backward cudnn_grid_sampler_backward max_pool2d_backward"""),
    **_table("movement", movement.scatter_into_zeros,
             "select_backward slice_backward diagonal_backward unfold_backward"),
    **_table("movement", movement.scatter_into_copy,
             "slice_scatter select_scatter diagonal_scatter as_strided_scatter"),
    # --- copies (copies.py)
    **_table("copy", copies.copy, "copy clone _to_copy _copy_from _copy_from_and_resize lift_fresh_copy _pin_memory"),
    **_table("copy", copies.local_scalar_dense, "_local_scalar_dense"),
    # --- losses (losses.py)
    **_table("loss", losses.nll_loss_forward, "nll_loss_forward nll_loss2d_forward"),
    **_table("loss", losses.nll_loss_backward, "nll_loss_backward nll_loss2d_backward"),
    **_table("loss", losses.elementwise_loss, """
        mse_loss mse_loss_backward smooth_l1_loss smooth_l1_loss_backward huber_loss
        huber_loss_backward binary_cross_entropy binary_cross_entropy_backward
        binary_cross_entropy_with_logits soft_margin_loss soft_margin_loss_backward
        multi_margin_loss multi_margin_loss_backward multilabel_margin_loss_forward
        multilabel_margin_loss_backward"""),
    # --- multi-tensor ops and optimizers (optimizers.py); _foreach_* by prefix below
    **_table("optimizer", optimizers.fused_optimizer, "_fused_adam _fused_adamw _fused_sgd _fused_adagrad"),
    **_table("optimizer", optimizers.amp_unscale, "_amp_foreach_non_finite_check_and_unscale"),
    # --- FFT and recurrent layers
    **_table("fft", spectral.fft, "_fft_r2c _fft_c2r _fft_c2c"),
    **_table("rnn", recurrent.cudnn_rnn, "_cudnn_rnn"),
    **_table("rnn", recurrent.cudnn_rnn_backward, "_cudnn_rnn_backward"),
    # --- no GPU work: views without a view tag, allocations, host-only queries
    **_ops(VIEW, """
        _unsafe_view unsafe_split unsafe_split_with_sizes detach detach_ alias lift_fresh
        _reshape_alias view as_strided as_strided_ t t_ transpose transpose_ expand permute
        slice select split split_with_sizes unbind squeeze squeeze_ unsqueeze unsqueeze_
        diagonal unfold view_as_real view_as_complex _neg_view _conj _fw_primal _make_dual"""),
    **_ops(ALLOCATION, """
        empty empty_like empty_strided new_empty new_empty_strided empty_permuted
        _efficientzerotensor resize resize_as _resize_output set lift _lazy_clone
        _make_dep_token"""),
    **_ops(HOST, """
        _assert_scalar _functional_assert_scalar _assert_tensor_metadata sym_constrain_range
        sym_constrain_range_for_size
        _functional_sym_constrain_range _functional_sym_constrain_range_for_size _print
        _fused_sdp_choice is_pinned is_same_size is_set_to _has_same_storage_numel record_stream
        _use_cudnn_ctc_loss _use_miopen_ctc_loss from_file"""),
}

# Deliberately not modelled: CUDA ops that a training step rarely reaches and whose cost is
# not a roofline (iterative solvers, dynamic programming, fused inference-only paths). They
# get the generic memory-bound fallback and are reported as unknown.
UNMODELLED_OPS = frozenset("""
    _linalg_det _linalg_eigh _linalg_eigvals _linalg_slogdet _linalg_solve_ex _linalg_svd
    _linalg_check_errors cholesky cholesky_inverse cholesky_solve _cholesky_solve_helper geqrf
    ormqr linalg_cholesky_ex linalg_eig linalg_eigvals linalg_householder_product linalg_inv_ex
    linalg_ldl_factor_ex linalg_ldl_solve linalg_lstsq linalg_lu linalg_lu_factor_ex
    linalg_lu_solve linalg_matrix_exp linalg_pinv linalg_qr linalg_solve_triangular lu_unpack
    triangular_solve _ctc_loss _ctc_loss_backward _cudnn_ctc_loss _pdist_forward _pdist_backward
    _trilinear _native_multi_head_attention _transformer_encoder_layer_fwd
    _triton_multi_head_attention _triton_scaled_dot_attention _cslt_sparse_mm
    _cslt_sparse_mm_search _cslt_compress _sparse_semi_structured_linear
    _sparse_semi_structured_mm _sparse_semi_structured_addmm _sparse_semi_structured_apply
    _sparse_semi_structured_apply_dense _sparse_semi_structured_tile _to_sparse_semi_structured
    _spdiags _mixed_dtypes_linear
""".split())

# Ops of other backends (CPU-only kernels, MKLDNN, MPS, ROCm/MIOpen, quantized, sparse and
# nested layouts, test ops): a CUDA tensor never reaches them in a dense training job.
FOREIGN_PREFIXES = (
    "mkldnn", "_mkldnn", "mps_", "_mps", "_lstm_mps", "lstm_mps", "miopen", "quantized_", "_quantized",
    "quantize_", "q_", "_make_per_", "_empty_affine_quantized", "_empty_per_channel_affine_quantized",
    "empty_quantized", "_sparse", "sparse_", "_to_sparse", "to_sparse", "_nested", "to_padded_tensor",
    "_test_", "_dyn_quant", "_nnpack", "to_mkldnn",
)
FOREIGN_OPS = frozenset("""
    _foobar dequantize int_repr qscheme _coalesce _coalesced copy_sparse_to_sparse _to_dense
    _validate_compressed_sparse_indices _convert_indices_from_coo_to_csr
    _convert_indices_from_csr_to_coo ccol_indices crow_indices col_indices row_indices
    ccol_indices_copy crow_indices_copy col_indices_copy row_indices_copy indices values
    _indices _values _indices_copy _values_copy is_coalesced dense_dim sparse_dim _nnz _dimI _dimV
    hspmm sspaddmm _spsolve _grid_sampler_2d_cpu_fallback _grid_sampler_2d_cpu_fallback_backward
    _weight_int4pack_mm_for_cpu _convert_weight_to_int4pack_for_cpu
    _scaled_dot_product_flash_attention_for_cpu _scaled_dot_product_flash_attention_for_cpu_backward
    _scaled_dot_product_attention_math_for_mps matmul_backward resize_as_sparse
    _sparse_broadcast_to_copy _sparse_mm_reduce_impl _sparse_mm_reduce_impl_backward
""".split())

VIEW_NAMES = frozenset(n for n, f in OP_FAMILIES.items() if f is VIEW)


def _twin(name: str) -> str:
    """addmm_ -> addmm, _fused_adamw_ -> _fused_adamw; dunder names stay."""
    if name.endswith("_") and not name.endswith("__"):
        return name[:-1]
    return name


# Ops of other namespaces that launch kernels of their own, by qualified name.
QUALIFIED_FAMILIES: dict[str, Family] = {
    "fsdp::all_gather_copy_in": Family("movement", movement.fsdp_all_gather_copy_in),
    "fsdp::split_with_sizes_copy": Family("movement", movement.fsdp_split_with_sizes_copy),
    "fsdp::chunk_cat": Family("cat", movement.fsdp_chunk_cat),
    # higher-order ops reported as one fused kernel (interpose/ops/hops.py)
    "higher_order::flex_attention": Family("attention", attention.flex_attention),
    "higher_order::flex_attention_backward": Family("attention", attention.flex_attention),
    # kernels of CUDA extensions built at run time, which phantora never compiles
    # (interpose/device/cuda_extensions.py)
    "cuda_extension::multi_tensor_adam": Family("optimizer", optimizers.extension_multi_tensor_adam),
    # FlashAttention 3's kernels (interpose/device/flash_attn3.py), timed as aten's flash attention
    "flash_attn_3::fwd": Family("attention", attention.flash_attn_3),
    "flash_attn_3::bwd": Family("attention", attention.flash_attn_3),
    # Apex's and Megatron's fused kernels (interpose/device/apex_kernels.py), each as the kernel it is
    **_ops(Family("softmax", apex.upper_triang_softmax),
           "apex::scaled_upper_triang_masked_softmax_forward apex::scaled_upper_triang_masked_softmax_backward_"),
    **_ops(Family("softmax", apex.scaled_softmax),
           "apex::scaled_masked_softmax_forward apex::scaled_masked_softmax_backward "
           "apex::scaled_softmax_forward apex::scaled_softmax_backward_"),
    **_ops(Family("norm", apex.fused_layer_norm), "apex::fused_layer_norm"),
    **_ops(Family("norm", apex.fused_layer_norm_backward), "apex::fused_layer_norm_backward"),
    **_ops(Family("norm", apex.fast_layer_norm), "apex::fast_layer_norm_fwd apex::fast_layer_norm_bwd"),
    "apex::wgrad_gemm_accum": Family("gemm", apex.wgrad_gemm_accum),
    **_ops(Family("foreach", apex.multi_tensor),
           "apex::multi_tensor_scale apex::multi_tensor_axpby apex::multi_tensor_l2norm"),
    # Transformer Engine's core-library kernels (interpose/device/transformer_engine/ops.py)
    "nvte::cublas_gemm": Family("gemm", transformer_engine.cublas_gemm),
    "nvte::grouped_gemm": Family("gemm", transformer_engine.grouped_gemm),
    "nvte::layernorm_fwd": Family("norm", transformer_engine.norm_fwd),
    "nvte::rmsnorm_fwd": Family("norm", transformer_engine.norm_fwd),
    "nvte::layernorm_bwd": Family("norm", transformer_engine.norm_bwd),
    "nvte::rmsnorm_bwd": Family("norm", transformer_engine.norm_bwd),
    "nvte::activation": Family("pointwise", transformer_engine.activation),
    "nvte::activation_bwd": Family("pointwise", transformer_engine.activation_bwd),
    "nvte::softmax_fwd": Family("softmax", transformer_engine.softmax_fwd),
    "nvte::softmax_bwd": Family("softmax", transformer_engine.softmax_bwd),
    "nvte::cast_transpose": Family("copy", transformer_engine.cast_transpose),
    "nvte::compute_amax": Family("reduction", transformer_engine.compute_amax),
    "nvte::quantize_blocks": Family("copy", transformer_engine.quantize_blocks),
    "nvte::compute_scale": Family("pointwise", transformer_engine.compute_scale),
    "nvte::fp8_transpose": Family("movement", transformer_engine.fp8_transpose),
    "nvte::dequantize": Family("copy", transformer_engine.dequantize),
    "nvte::amax_and_scale_update": Family("pointwise", transformer_engine.amax_and_scale_update),
    "nvte::rope": Family("pointwise", transformer_engine.rope),
    "nvte::router_fwd": Family("reduction", transformer_engine.router),
    "nvte::router_bwd": Family("reduction", transformer_engine.router),
    "nvte::aux_loss_fwd": Family("reduction", transformer_engine.aux_loss),
    "nvte::aux_loss_bwd": Family("pointwise", transformer_engine.aux_loss),
    "nvte::fused_attn_fwd": Family("attention", transformer_engine.fused_attn),
    "nvte::fused_attn_bwd": Family("attention", transformer_engine.fused_attn),
    "nvte::multi_tensor_scale": Family("foreach", transformer_engine.multi_tensor_scale),
    "nvte::multi_tensor_l2norm": Family("foreach", transformer_engine.multi_tensor_l2norm),
    "nvte::multi_tensor_compute_scale": Family("foreach", transformer_engine.multi_tensor_compute_scale),
}


def classify(qualified_name: str, tags: frozenset[str] = frozenset()) -> Family | None:
    """The family that times this op, or None when phantora does not know it."""
    namespace, _, name = qualified_name.rpartition("::")
    if namespace and namespace != "aten":
        return QUALIFIED_FAMILIES.get(qualified_name) or NAMESPACE_FAMILIES.get(namespace)
    family = OP_FAMILIES.get(name) or OP_FAMILIES.get(_twin(name))
    if family is not None:
        return family
    if name.startswith("_foreach_"):
        return FOREACH
    if name in UNMODELLED_OPS:
        return UNMODELLED
    if name in FOREIGN_OPS or _twin(name) in FOREIGN_OPS or name.startswith(FOREIGN_PREFIXES):
        return FOREIGN
    if "view" in tags or "inplace_view" in tags:
        return VIEW
    if "view_copy" in tags or (name.endswith("_copy") and name.removesuffix("_copy") in VIEW_NAMES):
        return VIEW_COPY
    if "reduction" in tags:
        return REDUCTION
    if "pointwise" in tags:
        return POINTWISE
    if "nondeterministic_seeded" in tags:
        return RNG
    return None
