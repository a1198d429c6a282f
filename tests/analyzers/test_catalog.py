"""The helper catalog: built-in coverage of real TE 2.20.2 names, user extensions, bad files."""

from __future__ import annotations

from pathlib import Path

import pytest

from analyzers.catalog import CatalogError, builtin_catalog, load_catalog
from analyzers.report import Category

CATALOG = builtin_catalog()

# Names copied from the real traces in tests/data/te-2.20.2-h200x2 (Kineto frames, nsys ranges,
# nsys short kernel names, Kineto demangled kernel names).
RANGE_CASES = [
    (
        "transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py(214): "
        "get_cu_seqlens_on_cp_rank",
        "get_cu_seqlens_on_cp_rank",
        True,
    ),
    (
        "transformer_engine.pytorch.attention.dot_product_attention.context_parallel."
        "get_cu_seqlens_on_cp_rank",
        "get_cu_seqlens_on_cp_rank",
        False,
    ),
    (
        "transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py(99): "
        "_zero_thd_padding",
        "te_thd_grad_zero_fill",
        True,
    ),
    (
        "transformer_engine/pytorch/attention/dot_product_attention/utils.py(1925): "
        "get_thd_padding_mask",
        "te_thd_grad_zero_fill",
        True,
    ),
    ("nvte_thd_get_partitioned_indices", "te_thd_get_partitioned_indices", False),
    ("nvte_thd_read_half_tensor", "te_thd_read_half_tensor", False),
    ("nvte_fused_attn_fwd_v2", "te_fused_attn_fwd", False),
    (
        "<built-in method thd_grad_correction of "
        "pybind11_builtins.pybind11_detail_function_record_v1"
        " object at 0x7efbf19eef30>",
        "te_thd_grad_correction",
        True,
    ),
    ("transformer_engine.AttnFuncWithCPAndKVP2P.backward", "te_cp_backward", False),
    ("DotProductAttention forward", "te_dot_product_attention", False),
    ("cp_attention.grad_zero_fill", "cp_attention.grad_zero_fill", False),
    ("megatron/core/utils.py(1700): get_batch_on_this_cp_rank", "get_batch_on_this_cp_rank", True),
]

KERNEL_CASES = [
    (
        "triton_per_fused__to_copy_add_clamp_cumsum_floor_divide_mul_slice_sub_zeros_like_0",
        "get_cu_seqlens_on_cp_rank",
    ),
    ("thd_read_half_tensor_kernel", "te_thd_read_half_tensor"),
    (
        "void transformer_engine::context_parallel::thd_lse_kernel<true, transformer_engine::"
        "context_parallel::LseCorrectionFunctor>(float*, float*, int*, int, int, int, int)",
        "te_thd_lse_correction",
    ),
    (
        "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x128_1x4x1_cga1x1x1"
        "_kernel0_0",
        "te_fused_attn_bwd",
    ),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "cp_p2p_send_recv"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "cp_all_gather"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "nccl_all_reduce"),
    ("thd_partition_indices_kernel", "te_thd_get_partitioned_indices"),
]


@pytest.mark.parametrize(("name", "helper", "via_python"), RANGE_CASES)
def test_builtin_matches_real_range_names(name: str, helper: str, via_python: bool) -> None:
    index, python = CATALOG.match_range(name)
    assert CATALOG.helpers[index].name == helper
    assert python is via_python


@pytest.mark.parametrize(("name", "helper"), KERNEL_CASES)
def test_builtin_matches_real_kernel_names(name: str, helper: str) -> None:
    assert CATALOG.helpers[CATALOG.match_kernel(name)].name == helper


def test_uncatalogued_names_do_not_match() -> None:
    assert CATALOG.match_range("aten::copy_") == (-1, False)
    assert CATALOG.match_kernel("void at::native::vectorized_elementwise_kernel<4>") == -1


def test_builtin_covers_every_cp_attention_phase_and_category() -> None:
    names = {h.name for h in CATALOG.helpers}
    for phase in (
        "metadata",
        "partition",
        "attn_fwd_step",
        "attn_bwd_step",
        "comm_send_recv",
        "comm_all_gather",
        "merge",
        "grad_zero_fill",
        "grad_reduce",
    ):
        assert f"cp_attention.{phase}" in names
    assert {h.category for h in CATALOG.helpers} >= set(Category) - {Category.OTHER}
    assert CATALOG.version


def test_extra_catalog_goes_first_and_replaces_by_name(tmp_path: Path, monkeypatch) -> None:
    extra = tmp_path / "extra.toml"
    extra.write_text(
        '[catalog]\nname = "mine"\nversion = "3"\n'
        '[[helper]]\nname = "my_packer"\ncategory = "metadata"\nranges = ["re:^pack_\\\\d+$"]\n'
        '[[helper]]\nname = "get_cu_seqlens_on_cp_rank"\ncategory = "host sync"\n'
        'ranges = ["get_cu_seqlens_on_cp_rank"]\n'
    )
    cat = load_catalog([extra], use_env=False)
    assert cat.helpers[0].name == "my_packer"
    assert cat.helpers[cat.match_range("pack_12")[0]].name == "my_packer"
    assert cat.match_range("pack_x")[0] == -1
    replaced = [h for h in cat.helpers if h.name == "get_cu_seqlens_on_cp_rank"]
    assert len(replaced) == 1 and replaced[0].category is Category.HOST_SYNC
    assert "mine-3" in cat.version
    monkeypatch.setenv("CPTRACE_CATALOG", str(extra))
    assert load_catalog().helpers[0].name == "my_packer"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[helper]]\nname = 'x'\nranges = ['a'\n", "not valid TOML"),
        ("[[helper]]\nname = 'x'\ncategory = 'gpu stuff'\nranges = ['a']\n", "category"),
        ("[[helper]]\nname = 'x'\nranges = ['a']\ncolour = 'red'\n", "unknown field"),
        ("[[helper]]\nname = 'x'\n", "needs at least one"),
        ("[[helper]]\nname = 'x'\nranges = 'a'\nkernels = [1]\n", "'kernels'"),
        ("[[helper]]\nname = 'x'\nranges = ['re:(']\n", "bad regex"),
        ("[[helper]]\nname = 'x'\nkernels = ['a']\nblock_from = ['a']\n", "go together"),
        (
            "[[helper]]\nname = 'x'\nkernels = ['a']\nblock_from = ['a']\nblock_to = ['b']\n",
            "needs 'within'",
        ),
        ("[fp8_alignment]\nversions = { '2.20' = 'sixteen' }\n", "'versions'"),
        ("[fp8_alignment]\ndefault = 0\n", "'default'"),
    ],
)
def test_bad_catalog_names_file_and_field(tmp_path: Path, text: str, message: str) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    with pytest.raises(CatalogError) as err:
        load_catalog([bad], use_env=False)
    assert str(bad) in str(err.value) and message in str(err.value)


def test_fp8_alignment_per_te_version() -> None:
    catalog = builtin_catalog()
    assert catalog.fp8_multiple("2.20.2") == 16 and catalog.fp8_multiple("2.20") == 16
    assert catalog.fp8_multiple("2.200.1") == 8  # a prefix only at a version-part boundary
    assert catalog.fp8_multiple("2.19.1") == 8 and catalog.fp8_multiple(None) is None
    assert catalog.fp8_strictest() == 16


def test_missing_catalog_file(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="cannot read catalog"):
        load_catalog([tmp_path / "nope.toml"], use_env=False)


def _builtin_patterns() -> list[str]:
    """Every built-in glob (``re:`` patterns are regular expressions, not globs)."""
    patterns = [
        p
        for h in CATALOG.helpers
        for kind in ("ranges", "python", "kernels", "block_from", "block_to")
        for p in getattr(h, kind)
        if not p.startswith("re:")
    ]
    return [*patterns, *CATALOG.host_sync_apis, *CATALOG.host_sync_ops, *CATALOG.host_sync_memcpy]


def test_star_globs_match_exactly_like_fnmatch() -> None:
    """The ``*``-only globs are matched without regexes (catalog load time); they must answer
    exactly as ``fnmatch.translate``'s regex: every built-in pattern against the real names
    above and every pattern's own text, and random short patterns against random names."""
    import fnmatch
    import random
    import re

    from analyzers.catalog import _compile

    builtin = _builtin_patterns()
    names = [n for n, *_ in RANGE_CASES] + [n for n, _ in KERNEL_CASES]
    names += [p.replace("*", "") for p in builtin] + builtin + ["", "*", "a\nb"]
    rng = random.Random(10)
    random_patterns = [
        "".join(rng.choice("ab*.\\") for _ in range(rng.randint(0, 6))) for _ in range(400)
    ]
    random_names = [
        "".join(rng.choice("ab.\n\\*") for _ in range(rng.randint(0, 8))) for _ in range(400)
    ]
    for patterns, against in ((builtin, names), (random_patterns, random_names)):
        for pattern in patterns:
            fast, regex = _compile(pattern), re.compile(fnmatch.translate(pattern))
            for name in against:
                assert bool(fast.match(name)) == bool(regex.match(name)), (pattern, name)


def test_the_builtin_catalog_is_parsed_once_per_process() -> None:
    # Every analysis asks for it (``load_catalog`` without extras returns the built-in one):
    # the TOML parse and the pattern compilation are paid once, the immutable result shared.
    assert builtin_catalog() is builtin_catalog()
    assert load_catalog(use_env=False) is builtin_catalog()
    assert CATALOG is builtin_catalog()
