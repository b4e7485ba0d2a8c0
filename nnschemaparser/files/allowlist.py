"""The exact-name allowlist: which callables and torch constants a saved schema may name, and how.

A schema file names a callable as a string ("torch.nn.functional.linear", "operator.add"). Loading
looks the string up in one table of exact names built here from modules this package imports itself
(torch, torch.nn.functional, operator, math, builtins, copy, warnings, lowering.intrinsics):
nothing is imported, evaluated or looked up by attribute on behalf of a file. A name outside the
table is refused with `UnsafeReferenceError`. The table holds:

    builtins     pure functions, containers, isinstance/len/range/..., the built-in exception classes,
                 getattr/hasattr/setattr/delattr (guarded, see below); never eval, exec, compile,
                 open, __import__, globals, vars, input, breakpoint
    operator     the arithmetic, comparison and item operators; never attrgetter, methodcaller, call
    math         every function of the math module
    torch        the ATen functions (minus from_file and the sparse, quantized and backend-specific
                 ones), torch.linalg / fft / special, torch.nn.functional, torch.Tensor methods (minus
                 storage, sharing and numpy), a short list of Python-level helpers and classes, the
                 torch.nn module classes; never torch.load, torch.save, hub, jit.load, ops, library
    intrinsics   every helper the lowering emits (`intrinsics.__all__`), named `nnschemaparser.intrinsics.<name>`:
                 the file namespace of the module `nnschemaparser.lowering.intrinsics` (docs/FORMAT.md)

Attribute access is the one door out of this table, so attribute names are checked too: no dunder
name except a few harmless ones, and none of a short list of names that reach files, processes,
frames or serialisation. `getattr(x, name)` with a computed name runs through `checked_getattr`.

Depends on torch, the standard library, intrinsics and file_format; never on schemas or files.
"""

from __future__ import annotations

import builtins
import copy
import math
import operator
import re
import warnings
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..lowering import intrinsics
from .file_format import UnsafeReferenceError

__all__ = [
    "callable_name",
    "resolve_callable",
    "torch_constant_name",
    "resolve_torch_constant",
    "allowed_names",
    "attribute_problem",
    "check_attribute",
    "checked_getattr",
    "checked_hasattr",
    "checked_setattr",
    "checked_delattr",
    "ATTRIBUTE_ACCESSORS",
    "global_problem",
]


# 579 ATen functions exposed as torch.<name> (from torch._C._VariableFunctions, torch 2.13.0+cpu),
# without from_file and the sparse, quantized and backend-specific (cudnn, miopen, mkldnn, fbgemm) ones.
_TORCH_ATEN = """
    abs abs_ absolute acos acos_ acosh acosh_ adaptive_avg_pool1d adaptive_max_pool1d add addbmm addcdiv
    addcmul addmm addmv addmv_ addr adjoint affine_grid_generator alias_copy all allclose alpha_dropout
    alpha_dropout_ amax amin aminmax angle any arange arccos arccos_ arccosh arccosh_ arcsin arcsin_ arcsinh
    arcsinh_ arctan arctan2 arctan_ arctanh arctanh_ argmax argmin argsort argwhere as_strided as_strided_
    as_strided_copy as_strided_scatter as_tensor asarray asin asin_ asinh asinh_ atan atan2 atan_ atanh
    atanh_ atleast_1d atleast_2d atleast_3d avg_pool1d baddbmm bartlett_window batch_norm
    batch_norm_backward_elemt batch_norm_backward_reduce batch_norm_elemt batch_norm_gather_stats
    batch_norm_gather_stats_with_counts batch_norm_stats batch_norm_update_stats bernoulli bilinear
    binary_cross_entropy_with_logits bincount binomial bitwise_and bitwise_left_shift bitwise_not bitwise_or
    bitwise_right_shift bitwise_xor blackman_window block_diag bmm broadcast_tensors broadcast_to bucketize
    can_cast cartesian_prod cat ccol_indices_copy cdist ceil ceil_ celu celu_ chain_matmul channel_shuffle
    cholesky cholesky_inverse cholesky_solve choose_qparams_optimized chunk clamp clamp_ clamp_max
    clamp_max_ clamp_min clamp_min_ clip clip_ clone col_indices_copy column_stack combinations complex
    concat concatenate conj conj_physical conj_physical_ constant_pad_nd conv1d conv2d conv3d conv_tbc
    conv_transpose1d conv_transpose2d conv_transpose3d convolution copysign corrcoef cos cos_ cosh cosh_
    cosine_embedding_loss cosine_similarity count_nonzero cov cross crow_indices_copy ctc_loss cummax cummin
    cumprod cumsum cumulative_trapezoid deg2rad deg2rad_ dequantize det detach detach_ detach_copy diag
    diag_embed diagflat diagonal diagonal_copy diagonal_scatter diff digamma dist div divide dot dropout
    dropout_ dsmm dsplit dstack einsum embedding embedding_bag embedding_renorm_ empty empty_like
    empty_permuted empty_quantized empty_strided eq equal erf erf_ erfc erfc_ erfinv exp exp2 exp2_ exp_
    expand_copy expm1 expm1_ eye fake_quantize_per_channel_affine fake_quantize_per_tensor_affine
    feature_alpha_dropout feature_alpha_dropout_ feature_dropout feature_dropout_ fill fill_ fix fix_
    flatten flip fliplr flipud float_power floor floor_ floor_divide fmax fmin fmod frac frac_ frexp
    frobenius_norm from_numpy frombuffer full full_like fused_moving_avg_obs_fake_quant gather gcd gcd_ ge
    geqrf ger get_device gradient greater greater_equal grid_sampler grid_sampler_2d grid_sampler_3d
    group_norm gru gru_cell gt hamming_window hann_window hardshrink hash_tensor heaviside
    hinge_embedding_loss histc histogram histogramdd hsmm hsplit hspmm hstack hypot i0 i0_ igamma igammac
    imag index_add index_copy index_fill index_put index_put_ index_reduce index_select indices_copy inner
    instance_norm int_repr inverse is_complex is_conj is_distributed is_floating_point is_inference is_neg
    is_nonzero is_same_size is_signed is_vulkan_available isclose isfinite isin isinf isnan isneginf
    isposinf isreal istft kaiser_window kl_div kron kthvalue layer_norm lcm lcm_ ldexp ldexp_ le lerp less
    less_equal lgamma linspace log log10 log10_ log1p log1p_ log2 log2_ log_ log_softmax logaddexp
    logaddexp2 logcumsumexp logdet logical_and logical_not logical_or logical_xor logit logit_ logspace
    logsumexp lstm lstm_cell lt lu_solve lu_unpack margin_ranking_loss masked_fill masked_scatter
    masked_select matmul matrix_exp matrix_power max max_pool1d max_pool1d_with_indices max_pool2d
    max_pool3d maximum mean median meshgrid min minimum mm mode moveaxis movedim msort mul multinomial
    multiply mv mvlgamma nan_to_num nan_to_num_ nanmean nanmedian nanquantile nansum narrow narrow_copy
    native_batch_norm native_channel_shuffle native_dropout native_group_norm native_layer_norm native_norm
    ne neg neg_ negative negative_ nextafter nonzero nonzero_static norm norm_except_dim normal not_equal
    nuclear_norm numel ones ones_like orgqr ormqr outer pairwise_distance pdist permute permute_copy
    pinverse pixel_shuffle pixel_unshuffle poisson poisson_nll_loss polar polygamma positive pow prelu prod
    promote_types put q_per_channel_axis q_per_channel_scales q_per_channel_zero_points q_scale q_zero_point
    qr quantile quantize_per_channel quantize_per_tensor quantize_per_tensor_dynamic rad2deg rad2deg_ rand
    rand_like randint randint_like randn randn_like randperm range ravel real reciprocal reciprocal_ relu
    relu_ remainder renorm repeat_interleave reshape resize_as_ resolve_conj resolve_neg result_type
    rms_norm rnn_relu rnn_relu_cell rnn_tanh rnn_tanh_cell roll rot90 round round_ row_indices_copy
    row_stack rrelu rrelu_ rsqrt rsqrt_ rsub saddmm scalar_tensor scatter scatter_add scatter_reduce
    searchsorted segment_reduce select select_copy select_scatter selu selu_ sgn sigmoid sigmoid_ sign
    signbit sin sin_ sinc sinc_ sinh sinh_ slice_copy slice_inverse slice_scatter slogdet smm softmax sort
    split split_copy split_with_sizes split_with_sizes_copy spmm sqrt sqrt_ square square_ squeeze
    squeeze_copy sspaddmm stack std std_mean stft sub subtract sum svd swapaxes swapdims sym_constrain_range
    sym_constrain_range_for_size t t_copy take take_along_dim tan tan_ tanh tanh_ tensor tensor_split
    tensordot threshold threshold_ tile topk trace transpose transpose_copy trapezoid trapz triangular_solve
    tril tril_indices triplet_margin_loss triu triu_indices true_divide trunc trunc_ unbind unbind_copy
    unflatten unfold_copy unique_consecutive unsafe_chunk unsafe_split unsafe_split_with_sizes unsqueeze
    unsqueeze_copy values_copy vander var var_mean vdot view_as_complex view_as_complex_copy view_as_real
    view_as_real_copy view_copy vsplit vstack where xlogy xlogy_ zero_ zeros zeros_like
""".split()

# 132 public functions of torch.nn.functional.
_FUNCTIONAL = """
    adaptive_avg_pool1d adaptive_avg_pool2d adaptive_avg_pool3d adaptive_max_pool1d
    adaptive_max_pool1d_with_indices adaptive_max_pool2d adaptive_max_pool2d_with_indices
    adaptive_max_pool3d adaptive_max_pool3d_with_indices affine_grid alpha_dropout avg_pool1d avg_pool2d
    avg_pool3d batch_norm bilinear binary_cross_entropy binary_cross_entropy_with_logits celu celu_
    channel_shuffle conv1d conv2d conv3d conv_tbc conv_transpose1d conv_transpose2d conv_transpose3d
    cosine_embedding_loss cosine_similarity cross_entropy ctc_loss dropout dropout1d dropout2d dropout3d elu
    elu_ embedding embedding_bag feature_alpha_dropout fold fractional_max_pool2d
    fractional_max_pool2d_with_indices fractional_max_pool3d fractional_max_pool3d_with_indices
    gaussian_nll_loss gelu glu grid_sample group_norm grouped_mm gumbel_softmax hardshrink hardsigmoid
    hardswish hardtanh hardtanh_ hinge_embedding_loss huber_loss instance_norm interpolate kl_div l1_loss
    layer_norm leaky_relu leaky_relu_ linear linear_cross_entropy local_response_norm log_softmax logsigmoid
    lp_pool1d lp_pool2d lp_pool3d margin_ranking_loss max_pool1d max_pool1d_with_indices max_pool2d
    max_pool2d_with_indices max_pool3d max_pool3d_with_indices max_unpool1d max_unpool2d max_unpool3d mish
    mse_loss multi_head_attention_forward multi_margin_loss multilabel_margin_loss
    multilabel_soft_margin_loss native_channel_shuffle nll_loss normalize one_hot pad pairwise_distance
    pdist pixel_shuffle pixel_unshuffle poisson_nll_loss prelu relu relu6 relu_ rms_norm rrelu rrelu_
    scaled_dot_product_attention scaled_grouped_mm scaled_mm selu selu_ sigmoid silu smooth_l1_loss
    soft_margin_loss softmax softmin softplus softshrink softsign tanh tanhshrink threshold threshold_
    triplet_margin_loss triplet_margin_with_distance_loss unfold upsample upsample_bilinear upsample_nearest
""".split()

# 543 public methods of torch.Tensor, without the storage, sharing, numpy and sparse ones.
_TENSOR_METHODS = """
    abs abs_ absolute absolute_ acos acos_ acosh acosh_ add add_ addbmm addbmm_ addcdiv addcdiv_ addcmul
    addcmul_ addmm addmm_ addmv addmv_ addr addr_ adjoint all allclose amax amin aminmax angle any apply_
    arccos arccos_ arccosh arccosh_ arcsin arcsin_ arcsinh arcsinh_ arctan arctan2 arctan2_ arctan_ arctanh
    arctanh_ argmax argmin argsort argwhere as_strided as_strided_ as_strided_scatter as_subclass asin asin_
    asinh asinh_ atan atan2 atan2_ atan_ atanh atanh_ backward baddbmm baddbmm_ bernoulli bernoulli_
    bfloat16 bincount bitwise_and bitwise_and_ bitwise_left_shift bitwise_left_shift_ bitwise_not
    bitwise_not_ bitwise_or bitwise_or_ bitwise_right_shift bitwise_right_shift_ bitwise_xor bitwise_xor_
    bmm bool broadcast_to byte cauchy_ ccol_indices cdouble ceil ceil_ cfloat chalf char cholesky
    cholesky_inverse cholesky_solve chunk clamp clamp_ clamp_max clamp_max_ clamp_min clamp_min_ clip clip_
    clone coalesce col_indices conj conj_physical conj_physical_ contiguous copy_ copysign copysign_
    corrcoef cos cos_ cosh cosh_ count_nonzero cov cpu cross crow_indices cuda cummax cummin cumprod
    cumprod_ cumsum cumsum_ deg2rad deg2rad_ dense_dim dequantize det detach detach_ diag diag_embed
    diagflat diagonal diagonal_scatter diff digamma digamma_ dim dim_order dist div div_ divide divide_ dot
    double dsplit eig element_size eq eq_ equal erf erf_ erfc erfc_ erfinv erfinv_ exp exp2 exp2_ exp_
    expand expand_as expm1 expm1_ exponential_ fill_ fill_diagonal_ fix fix_ flatten flip fliplr flipud
    float float_power float_power_ floor floor_ floor_divide floor_divide_ fmax fmin fmod fmod_ frac frac_
    frexp gather gcd gcd_ ge ge_ geometric_ geqrf ger get_device greater greater_ greater_equal
    greater_equal_ gt gt_ half hardshrink hash_tensor heaviside heaviside_ histc histogram hsplit hypot
    hypot_ i0 i0_ igamma igamma_ igammac igammac_ index index_add index_add_ index_copy index_copy_
    index_fill index_fill_ index_put index_put_ index_reduce index_reduce_ index_select indices inner int
    int_repr inverse ipu is_coalesced is_complex is_conj is_contiguous is_distributed is_floating_point
    is_inference is_neg is_nonzero is_pinned is_same_size is_set_to is_signed isclose isfinite isinf isnan
    isneginf isposinf isreal istft item kron kthvalue lcm lcm_ ldexp ldexp_ le le_ lerp lerp_ less less_
    less_equal less_equal_ lgamma lgamma_ log log10 log10_ log1p log1p_ log2 log2_ log_ log_normal_
    log_softmax logaddexp logaddexp2 logcumsumexp logdet logical_and logical_and_ logical_not logical_not_
    logical_or logical_or_ logical_xor logical_xor_ logit logit_ logsumexp long lstsq lt lt_ lu lu_solve
    map2_ map_ masked_fill masked_fill_ masked_scatter masked_scatter_ masked_select matmul matrix_exp
    matrix_power max maximum mean median min minimum mm mode moveaxis movedim msort mtia mul mul_
    multinomial multiply multiply_ mv mvlgamma mvlgamma_ nan_to_num nan_to_num_ nanmean nanmedian
    nanquantile nansum narrow narrow_copy ndimension ne ne_ neg neg_ negative negative_ nelement new_empty
    new_empty_strided new_full new_ones new_tensor new_zeros nextafter nextafter_ nonzero nonzero_static
    norm normal_ not_equal not_equal_ numel orgqr ormqr outer permute pin_memory pinverse polygamma
    polygamma_ positive pow pow_ prelu prod put put_ q_per_channel_axis q_per_channel_scales
    q_per_channel_zero_points q_scale q_zero_point qr qscheme quantile rad2deg rad2deg_ random_ ravel
    reciprocal reciprocal_ register_hook register_post_accumulate_grad_hook reinforce relu relu_ remainder
    remainder_ renorm renorm_ repeat repeat_interleave requires_grad_ reshape reshape_as resize resize_
    resize_as resize_as_ resolve_conj resolve_neg retain_grad roll rot90 round round_ row_indices rsqrt
    rsqrt_ scatter scatter_ scatter_add scatter_add_ scatter_reduce scatter_reduce_ select select_scatter
    sgn sgn_ short sigmoid sigmoid_ sign sign_ signbit sin sin_ sinc sinc_ sinh sinh_ size slice_inverse
    slice_scatter slogdet smm softmax solve sort split split_with_sizes sqrt sqrt_ square square_ squeeze
    squeeze_ sspaddmm std stft storage_offset stride sub sub_ subtract subtract_ sum sum_to_size svd
    swapaxes swapaxes_ swapdims swapdims_ symeig t t_ take take_along_dim tan tan_ tanh tanh_ tensor_split
    tile to to_dense to_mkldnn to_padded_tensor tolist topk trace transpose transpose_ triangular_solve tril
    tril_ triu triu_ true_divide true_divide_ trunc trunc_ type type_as unbind unflatten unfold uniform_
    unique unique_consecutive unsafe_chunk unsafe_split unsafe_split_with_sizes unsqueeze unsqueeze_ values
    var vdot view view_as vsplit where xlogy xlogy_ xpu zero_
""".split()

_LINALG = """
    cholesky cholesky_ex cond cross det diagonal eig eigh eigvals eigvalsh householder_product inv inv_ex
    ldl_factor ldl_factor_ex ldl_solve lstsq lu lu_factor lu_factor_ex lu_solve matmul matrix_exp
    matrix_norm matrix_power matrix_rank multi_dot norm pinv qr slogdet solve solve_ex solve_triangular svd
    svdvals tensorinv tensorsolve vander vecdot vector_norm
""".split()

_FFT = """
    fft fft2 fftfreq fftn fftshift hfft hfft2 hfftn ifft ifft2 ifftn ifftshift ihfft ihfft2 ihfftn irfft
    irfft2 irfftn rfft rfft2 rfftfreq rfftn
""".split()

_SPECIAL = """
    airy_ai bessel_j0 bessel_j1 bessel_y0 bessel_y1 chebyshev_polynomial_t chebyshev_polynomial_u
    chebyshev_polynomial_v chebyshev_polynomial_w digamma entr erf erfc erfcx erfinv exp2 expit expm1
    gammainc gammaincc gammaln hermite_polynomial_h hermite_polynomial_he i0 i0e i1 i1e
    laguerre_polynomial_l legendre_polynomial_p log1p log_ndtr log_softmax logit logsumexp
    modified_bessel_i0 modified_bessel_i1 modified_bessel_k0 modified_bessel_k1 multigammaln ndtr ndtri
    polygamma psi round scaled_modified_bessel_k0 scaled_modified_bessel_k1 shifted_chebyshev_polynomial_t
    shifted_chebyshev_polynomial_u shifted_chebyshev_polynomial_v shifted_chebyshev_polynomial_w sinc
    softmax spherical_bessel_j0 xlog1py xlogy zeta
""".split()

_BUILTIN_FUNCTIONS = """
    abs all any ascii bin bool callable chr complex dict divmod enumerate filter float format frozenset hash
    hex id int isinstance issubclass iter len list map max min next oct ord pow print range repr reversed
    round set slice sorted str sum tuple type zip getattr hasattr setattr delattr
""".split()

_OPERATORS = """
    abs add and_ concat contains countOf delitem eq floordiv ge getitem gt iadd iand iconcat ifloordiv
    ilshift imatmul imod imul index indexOf inv invert ior ipow irshift is_ is_not isub itemgetter itruediv
    ixor le length_hint lshift lt matmul mod mul ne neg not_ or_ pos pow rshift setitem sub truediv truth xor
""".split()

_MATH = """
    acos acosh asin asinh atan atan2 atanh cbrt ceil comb copysign cos cosh degrees dist erf erfc exp exp2
    expm1 fabs factorial floor fmod frexp fsum gamma gcd hypot isclose isfinite isinf isnan isqrt lcm ldexp
    lgamma log log10 log1p log2 modf nextafter perm pow prod radians remainder sin sinh sqrt tan tanh trunc ulp
""".split()

# Python-level torch functions and classes models call in forward (read-only queries, constructors of
# inert values, grad-mode context managers). Global setters (set_*, manual_seed, ...) are not here.
_TORCH_PYTHON = """
    Tensor Size dtype device finfo iinfo Generator no_grad enable_grad inference_mode set_grad_enabled autocast
    SymInt SymFloat SymBool OutOfMemoryError atleast_1d atleast_2d atleast_3d block_diag broadcast_shapes
    broadcast_tensors cartesian_prod cdist chain_matmul einsum istft lu meshgrid norm split stft tensordot
    unique unique_consecutive unravel_index is_tensor is_grad_enabled is_inference_mode_enabled
    is_autocast_enabled is_autocast_cpu_enabled is_autocast_cache_enabled get_autocast_dtype
    get_autocast_cpu_dtype get_autocast_gpu_dtype get_default_dtype get_default_device typename
    are_deterministic_algorithms_enabled sym_int sym_float sym_max sym_min sym_not sym_sqrt sym_ite sym_sum
""".split()

_TORCH_OTHER = """
    torch.jit.is_scripting torch.jit.is_tracing torch.jit.annotate torch.compiler.is_compiling
    torch.compiler.is_dynamo_compiling torch.nn.Module torch.nn.Parameter torch.nn.utils.rnn.PackedSequence
    torch.nn.utils.rnn.pack_padded_sequence torch.nn.utils.rnn.pad_packed_sequence
    torch.nn.utils.rnn.pad_sequence torch.nn.utils.rnn.pack_sequence torch.nn.utils.rnn.unpack_sequence
    torch.nn.utils.rnn.unpad_sequence torch.nn.utils.rnn.invert_permutation
""".split()

_PYTHON_OTHER = {
    "copy.copy": copy.copy,
    "copy.deepcopy": copy.deepcopy,
    "warnings.warn": warnings.warn,
    "builtins.list.append": list.append,
    "builtins.set.add": set.add,
}


def _resolve_fixed(dotted: str) -> Any:
    """Walk one of the fixed dotted names above from the torch package (this module's own names)."""
    parts = dotted.split(".")
    assert parts[0] == "torch"
    obj: Any = torch
    for part in parts[1:]:
        obj = getattr(obj, part)
    return obj


def _entries() -> list[tuple[str, Any]]:
    entries: list[tuple[str, Any]] = []
    for name in _BUILTIN_FUNCTIONS:
        entries.append((f"builtins.{name}", getattr(builtins, name)))
    for name in sorted(dir(builtins)):
        value = getattr(builtins, name)
        if isinstance(value, type) and issubclass(value, BaseException):
            entries.append((f"builtins.{name}", value))
    entries.extend((f"operator.{name}", getattr(operator, name)) for name in _OPERATORS)
    entries.extend((f"math.{name}", getattr(math, name)) for name in _MATH if hasattr(math, name))
    entries.extend((f"nnschemaparser.intrinsics.{name}", getattr(intrinsics, name)) for name in intrinsics.__all__)
    entries.extend(_PYTHON_OTHER.items())
    entries.extend((f"torch.nn.functional.{name}", getattr(F, name)) for name in _FUNCTIONAL if hasattr(F, name))
    entries.extend((f"torch.{name}", getattr(torch, name)) for name in _TORCH_ATEN if hasattr(torch, name))
    entries.extend((f"torch.{name}", getattr(torch, name)) for name in _TORCH_PYTHON if hasattr(torch, name))
    for space, names in (("linalg", _LINALG), ("fft", _FFT), ("special", _SPECIAL)):
        module = getattr(torch, space)
        entries.extend((f"torch.{space}.{name}", getattr(module, name)) for name in names if hasattr(module, name))
    entries.extend((f"torch.Tensor.{name}", getattr(torch.Tensor, name)) for name in _TENSOR_METHODS
                   if hasattr(torch.Tensor, name))
    for name in nn.modules.__all__:
        value = getattr(nn, name, None)
        if isinstance(value, type):
            entries.append((f"torch.nn.{name}", value))
    for dotted in _TORCH_OTHER:
        try:
            entries.append((dotted, _resolve_fixed(dotted)))
        except AttributeError:
            pass  # an older torch without this helper
    return entries


_TABLE: Optional[dict[str, Any]] = None
_REVERSE: dict[int, str] = {}
_CONSTANTS: dict[str, Any] = {}


def _table() -> dict[str, Any]:
    global _TABLE
    if _TABLE is None:
        table: dict[str, Any] = {}
        reverse: dict[int, str] = {}
        for name, value in _entries():
            table.setdefault(name, value)
            reverse.setdefault(id(value), name)
        for name in dir(torch):
            value = getattr(torch, name, None)
            if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
                _CONSTANTS.setdefault(name, value)
        _REVERSE.update(reverse)
        _TABLE = table
    return _TABLE


def allowed_names() -> frozenset[str]:
    """Every exact name a schema file may use for a callable."""
    return frozenset(_table())


def callable_name(value: Any) -> Optional[str]:
    """The allowlisted name of `value` (by identity), or None when it is not on the allowlist.

    The checked accessors save as the builtins they stand for ("builtins.getattr").
    """
    table = _table()
    for builtin, (checked, _) in ATTRIBUTE_ACCESSORS.items():
        if value is checked:
            return f"builtins.{builtin.__name__}"
    name = _REVERSE.get(id(value))
    if name is not None and table[name] is value:
        return name
    return None


def resolve_callable(name: Any, where: str) -> Any:
    """The object of allowlisted `name`; anything else is refused before it could be used."""
    table = _table()
    if type(name) is str and name in table:
        return table[name]
    shown = name if type(name) is str else repr(name)
    raise UnsafeReferenceError(f"{where}: the callable {shown!r} is not on the allowlist of exact names "
                               "(torch, torch.nn.functional, Tensor methods, operator, math, safe builtins and "
                               "the lowering's intrinsics); the file is refused and nothing was run")


def torch_constant_name(value: Any) -> Optional[str]:
    """"float32" for torch.float32, "strided" for torch.strided; None for anything else."""
    if not isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
        return None
    _table()
    name = str(value).replace("torch.", "", 1)
    return name if _CONSTANTS.get(name) is value else None


def resolve_torch_constant(name: Any, where: str) -> Any:
    _table()
    if type(name) is str and name in _CONSTANTS:
        return _CONSTANTS[name]
    raise UnsafeReferenceError(f"{where}: {name!r} is not a torch dtype, layout or memory format")


# --- attributes -------------------------------------------------------------------------------

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
SAFE_DUNDERS = frozenset({"__name__", "__qualname__", "__class__", "__doc__", "__module__"})
# Names that reach the file system, processes, frames, code objects or (un)pickling.
REFUSED_ATTRIBUTES = frozenset("""
    tofile dump dumps load loads save save_pretrained push_to_hub from_pretrained to_json_file from_file
    write_text write_bytes read_text read_bytes unlink rmtree system popen spawnv spawnve execv execve fork
    kill ctypes storage untyped_storage _typed_storage storage_type share_memory_ _share_filename_cpu_
    _share_fd_cpu_ hub serialization ops library classes package jit _C _dynamo _inductor compile exec eval
    import_module exec_module load_module f_globals f_locals f_builtins f_back f_code gi_frame gi_code
    cr_frame cr_code ag_frame ag_code tb_frame tb_next func_globals func_code mro load_state_dict
    environ subprocess os sys builtins importlib pickle shutil
""".split())


def attribute_problem(name: Any, *, write: bool = False) -> Optional[str]:
    """Why attribute `name` must not be accessed (None when it may be)."""
    if type(name) is not str:
        return f"an attribute name must be a string, not {type(name).__name__}"
    if not _IDENTIFIER.match(name):
        return f"{name[:60]!r} is not an identifier"
    if name.startswith("__") and name.endswith("__") and (write or name not in SAFE_DUNDERS):
        return f"the dunder attribute {name!r} opens the way to code objects and globals"
    if name in REFUSED_ATTRIBUTES:
        return f"the attribute {name!r} reaches files, processes, frames or serialisation"
    return None


def check_attribute(name: Any, where: str, *, write: bool = False) -> None:
    problem = attribute_problem(name, write=write)
    if problem is not None:
        raise UnsafeReferenceError(f"{where}: {problem}; the file is refused")


def checked_getattr(obj: Any, name: Any, *default: Any) -> Any:
    """getattr for a name computed at run time: the same rule as for names written in the file."""
    problem = attribute_problem(name)
    if problem is not None:
        raise UnsafeReferenceError(f"getattr refused at run time: {problem}")
    return getattr(obj, name, *default)


def checked_hasattr(obj: Any, name: Any) -> bool:
    problem = attribute_problem(name)
    if problem is not None:
        raise UnsafeReferenceError(f"hasattr refused at run time: {problem}")
    return hasattr(obj, name)


def checked_setattr(obj: Any, name: Any, value: Any) -> None:
    problem = attribute_problem(name, write=True)
    if problem is not None:
        raise UnsafeReferenceError(f"setattr refused at run time: {problem}")
    setattr(obj, name, value)


def checked_delattr(obj: Any, name: Any) -> None:
    problem = attribute_problem(name, write=True)
    if problem is not None:
        raise UnsafeReferenceError(f"delattr refused at run time: {problem}")
    delattr(obj, name)


ATTRIBUTE_ACCESSORS: dict[Callable, tuple[Callable, bool]] = {
    getattr: (checked_getattr, False),
    hasattr: (checked_hasattr, False),
    setattr: (checked_setattr, True),
    delattr: (checked_delattr, True),
}


# --- globals of the model's code --------------------------------------------------------------

# Modules whose objects a schema never needs and a hostile file would want: the file system,
# processes, the interpreter, code objects, (un)pickling, the network.
_REFUSED_MODULES = frozenset("""
    os posix nt posixpath ntpath subprocess sys shutil importlib pickle _pickle copyreg marshal shelve socket
    ssl ctypes _ctypes code codeop pty pdb bdb runpy multiprocessing io _io pathlib tempfile signal threading
    _thread asyncio concurrent webbrowser http urllib ftplib smtplib poplib imaplib telnetlib xmlrpc
    socketserver zipimport pkgutil site sysconfig gc glob fileinput zipfile tarfile gzip bz2 lzma sqlite3 dbm
    select selectors mmap resource getpass venv ensurepip distutils compileall py_compile trace timeit
    profile cProfile builtins inspect linecache tokenize ast dis types atexit faulthandler tracemalloc shlex
    pwd grp fcntl termios tty pipes mailbox dill cloudpickle joblib IPython
""".split())
_REFUSED_PREFIXES = tuple("""
    torch.load torch.save torch.serialization torch.hub torch.from_file torch.jit torch.package torch.ops
    torch.library torch.classes torch.utils.cpp_extension torch.utils.data torch.multiprocessing
    torch.distributed torch._C.import_ir_module torch._C.import_ir_module_from_buffer torch._dynamo
    torch._inductor torch.compile torch.storage torch.UntypedStorage torch.TypedStorage numpy.testing numpy.load numpy.save numpy.fromfile
    numpy.lib.npyio numpy.ctypeslib numpy.f2py numpy.distutils logging.config logging.handlers
    transformers.utils.hub transformers.dynamic_module_utils
""".split())


def global_problem(dotted: str) -> Optional[str]:
    """Why a reference to `dotted` (a module-qualified name) must be refused, or None."""
    if type(dotted) is not str or not dotted:
        return "an empty name"
    if dotted.split(".", 1)[0] in _REFUSED_MODULES:
        return f"{dotted!r} belongs to a module a schema never needs (files, processes, the interpreter)"
    for prefix in _REFUSED_PREFIXES:
        if dotted == prefix or dotted.startswith(prefix + "."):
            return f"{dotted!r} loads, saves or compiles code or data"
    return None
