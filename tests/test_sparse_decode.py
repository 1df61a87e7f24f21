"""Sparse MLA decode kernel (tunecache.kernels.sparse_decode) against its fp32 torch reference.

Runs under the Triton interpreter on a CPU (TUNECACHE_TEST_GPU=1 runs the same tests on CUDA). Every
kernel launch goes through ``config=`` (one fixed config, no autotuning) so that these tests check
the kernel, not the tuner; the autotuned path is tested with the tuner.
"""

from __future__ import annotations

import os

# Must precede any triton import in this process (tests/conftest.py does the same).
if os.environ.get("TUNECACHE_TEST_GPU") != "1":
    os.environ["TRITON_INTERPRET"] = "1"

import json  # noqa: E402
import math  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from tunecache.kernels import sparse_decode as sd  # noqa: E402
from tunecache.kernels import sparse_decode_sm90 as sm90  # noqa: E402

DEV = "cuda" if os.environ.get("TUNECACHE_TEST_GPU") == "1" else "cpu"
CFG = {"BLOCK_T": 16, "num_warps": 4, "num_stages": 1}
SLOTS = 256
SCALE = 576**-0.5
FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16


def make(
    batch: int,
    topk: int,
    *,
    heads: int = 16,
    kv_dtype: torch.dtype = BF16,
    slots: int = SLOTS,
    seed: int = 0,
    q_mag: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(batch, heads, 576, generator=g) * q_mag).to(BF16)
    kv = torch.randn(slots, 576, generator=g).to(kv_dtype)
    idx = torch.randint(0, slots, (batch, topk), generator=g, dtype=torch.int32)
    return q.to(DEV), kv.to(DEV), idx.to(DEV)


def rel_err(out: torch.Tensor, ref: torch.Tensor, valid: torch.Tensor) -> float:
    """max |out - ref| / max |ref| over the (query, head) rows that have a valid index."""
    diff = (out.float() - ref)[valid].abs().max()
    return (diff / ref[valid].abs().max()).item()


def run_and_check(
    q: torch.Tensor,
    kv: torch.Tensor,
    idx: torch.Tensor,
    *,
    k_scale: float = 1.0,
    sm_scale: float = SCALE,
    **kw: object,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the kernel, compare with the reference, and check the empty-row contract."""
    out, lse = sd.sparse_mla_decode(q, kv, idx, sm_scale, k_scale=k_scale, config=CFG, **kw)
    ref, ref_lse = sd.reference(q, kv, idx, sm_scale, k_scale=k_scale)
    B, H, _ = q.shape
    assert out.shape == (B, H, 512) and out.dtype == BF16
    assert lse.shape == (B, H) and lse.dtype == torch.float32
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    valid = torch.isfinite(ref_lse)
    if valid.any():
        assert rel_err(out, ref, valid) <= 1e-2
        lse_tol = 1e-4 * max(1.0, ref_lse[valid].abs().max().item())
        assert (lse[valid] - ref_lse[valid]).abs().max().item() <= lse_tol
    assert (out[~valid] == 0).all()
    assert torch.isneginf(lse[~valid]).all()
    return out, lse


# ---- the reference itself, on cases checkable by hand ----------------------------------------------


def _hand_case() -> tuple[torch.Tensor, torch.Tensor]:
    q = torch.zeros(1, 2, 576)
    q[0, 0, 0] = 1.0  # head 0: nope dim 0
    q[0, 0, 512] = 2.0  # head 0: rope dim 0; head 1 stays all zero
    kv = torch.zeros(8, 576)
    kv[3, 0], kv[3, 1], kv[3, 512] = 1.0, 4.0, 0.5  # score(head 0) = (1*1 + 2*0.5) * scale
    kv[5, 0], kv[5, 2] = 3.0, -2.0  # score(head 0) = 3 * scale
    return q.to(BF16), kv.to(BF16)


def test_reference_one_valid_index_returns_that_v_row_and_its_score() -> None:
    q, kv = _hand_case()
    idx = torch.tensor([[-1, 3, -1]], dtype=torch.int32)
    out, lse = sd.reference(q, kv, idx, 0.5, k_scale=2.0)
    # k_scale 2 doubles the key (score) and the value.
    assert lse[0, 0].item() == pytest.approx((1.0 + 2.0 * 0.5) * 2.0 * 0.5)
    assert lse[0, 1].item() == pytest.approx(0.0)  # zero query: score 0, log(exp(0)) = 0
    for h in (0, 1):
        assert torch.equal(out[0, h], 2.0 * kv[3, :512].float())


def test_reference_two_indices_softmax_by_hand() -> None:
    q, kv = _hand_case()
    idx = torch.tensor([[3, -1, 5]], dtype=torch.int32)
    out, lse = sd.reference(q, kv, idx, 0.5)
    s3, s5 = (1.0 + 1.0) * 0.5, 3.0 * 0.5
    assert lse[0, 0].item() == pytest.approx(math.log(math.exp(s3) + math.exp(s5)), rel=1e-6)
    w3 = math.exp(s3) / (math.exp(s3) + math.exp(s5))
    expect = w3 * kv[3, :512].float() + (1 - w3) * kv[5, :512].float()
    assert torch.allclose(out[0, 0], expect, atol=1e-6)
    # Head 1 has a zero query: equal weights, lse = log 2.
    assert lse[0, 1].item() == pytest.approx(math.log(2.0))
    assert torch.allclose(out[0, 1], 0.5 * (kv[3, :512] + kv[5, :512]).float(), atol=1e-6)


def test_reference_row_without_valid_index_is_zero_and_minus_inf() -> None:
    q, kv = _hand_case()
    idx = torch.tensor([[-1, -1, -1], [3, -1, -1]], dtype=torch.int32)
    out, lse = sd.reference(q.expand(2, -1, -1), kv, idx, 0.5)
    assert (out[0] == 0).all() and torch.isneginf(lse[0]).all()
    assert torch.isfinite(lse[1]).all()


# ---- kernel against the reference ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kv_dtype", "num_splits", "k_scale"),
    [(BF16, 1, 1.0), (BF16, 3, 1.0), (FP8, 1, 0.37), (FP8, 4, 0.37)],
)
def test_matches_reference_with_ragged_and_scattered_invalid(
    kv_dtype: torch.dtype, num_splits: int, k_scale: float
) -> None:
    q, kv, idx = make(3, 80, kv_dtype=kv_dtype, seed=1)
    idx[0, 50:] = -1  # ragged tail
    idx[1, ::3] = -1  # scattered holes
    idx[2, 7] = idx[2, 8]  # a duplicate slot counts twice, as in the reference
    run_and_check(q, kv, idx, k_scale=k_scale, num_splits=num_splits)


def test_ragged_tails_of_every_length() -> None:
    q, kv, idx = make(4, 80, seed=2)
    for b, n in enumerate((80, 17, 1, 64)):
        idx[b, n:] = -1
    out, lse = run_and_check(q, kv, idx, num_splits=2)
    # One valid index: the output is that V row and lse that single score.
    row = kv[idx[2, 0].long()].float()
    assert torch.allclose(out[2].float(), row[:512].expand(16, -1), rtol=1e-2, atol=1e-2)
    assert torch.allclose(lse[2], (q[2].float() @ row) * SCALE, atol=1e-3)


@pytest.mark.parametrize("num_splits", [1, 4])
def test_fully_invalid_rows_give_zero_and_minus_inf(num_splits: int) -> None:
    q, kv, idx = make(4, 64, kv_dtype=FP8, seed=3)
    idx[1] = -1
    idx[3] = -1
    out, lse = run_and_check(q, kv, idx, k_scale=0.5, num_splits=num_splits)
    assert (out[[1, 3]] == 0).all() and torch.isneginf(lse[[1, 3]]).all()
    assert torch.isfinite(lse[[0, 2]]).all() and (out[[0, 2]] != 0).any()


def test_empty_splits_are_skipped_by_the_merge() -> None:
    q, kv, idx = make(2, 64, seed=4)
    idx[0, 16:48] = -1  # with 4 splits of 16, splits 1 and 2 of row 0 are empty
    idx[1, :48] = -1  # row 1: only the last split has anything
    o_part = torch.empty(2, 16, 4, 512, device=DEV)
    lse_part = torch.empty(2, 16, 4, device=DEV)
    sd._launch_split(q, kv, idx, o_part, lse_part, SCALE, 1.0, 4, CFG)
    empty = torch.tensor([[False, True, True, False], [True, True, True, False]], device=DEV)
    empty = empty[:, None, :].expand(-1, 16, -1)  # [B, H, S]
    assert torch.isneginf(lse_part[empty]).all() and (o_part[empty] == 0).all()
    assert torch.isfinite(lse_part[~empty]).all()
    run_and_check(q, kv, idx, num_splits=4)


def test_merge_never_reads_an_empty_split() -> None:
    # An empty split's partial o is garbage here (NaN): weight 0 times NaN would poison the sum
    # unless the merge skips the read. A row with every split empty must give 0 and -inf.
    g = torch.Generator().manual_seed(10)
    o_part = torch.randn(2, 3, 5, 512, generator=g)
    lse_part = torch.randn(2, 3, 5, generator=g) * 4
    empty = torch.rand(2, 3, 5, generator=g) < 0.4
    empty[1, 2] = True
    lse_part[empty] = float("-inf")
    o_part[empty] = float("nan")
    out = torch.empty(2, 3, 512, dtype=BF16, device=DEV)
    lse = torch.empty(2, 3, device=DEV)
    sd._launch_merge(o_part.to(DEV), lse_part.to(DEV), out, lse)
    w = torch.softmax(lse_part, dim=-1).nan_to_num(0.0)  # rows with every split empty: 0
    ref = (w[..., None] * o_part.nan_to_num(0.0)).sum(dim=2)
    ref_lse = torch.logsumexp(lse_part, dim=-1)
    assert not torch.isnan(out).any()
    assert torch.allclose(out.float().cpu(), ref, rtol=1e-2, atol=1e-2)
    assert torch.allclose(lse.cpu(), ref_lse, atol=1e-5)  # allclose takes -inf == -inf
    assert (out[1, 2] == 0).all() and torch.isneginf(lse[1, 2])


def test_one_split_equals_sixteen_splits() -> None:
    q, kv, idx = make(2, 96, kv_dtype=FP8, seed=5)
    idx[1, 40:] = -1
    # 16 splits of 6 indices each: chunk boundaries fall inside BLOCK_T=16 blocks.
    out1, lse1 = run_and_check(q, kv, idx, k_scale=0.8, num_splits=1)
    out16, lse16 = run_and_check(q, kv, idx, k_scale=0.8, num_splits=16)
    assert torch.allclose(lse1, lse16, rtol=0, atol=1e-4)
    assert torch.allclose(out1.float(), out16.float(), rtol=2e-2, atol=1e-2)


def test_default_num_splits_uses_the_heuristic() -> None:
    q, kv, idx = make(1, 256, seed=6)
    chosen = sd.choose_num_splits(1, 16, 256, sd.DEFAULT_NUM_SMS)
    assert chosen > 1  # this shape must exercise the merge
    out_default, lse_default = run_and_check(q, kv, idx)
    out_explicit, lse_explicit = run_and_check(q, kv, idx, num_splits=chosen)
    if DEV == "cpu":  # on CUDA the SM count of the card decides
        assert torch.equal(out_default, out_explicit) and torch.equal(lse_default, lse_explicit)


def test_large_scores_stay_finite() -> None:
    q, kv, idx = make(2, 48, kv_dtype=FP8, seed=7, q_mag=60.0)
    _, ref_lse = sd.reference(q, kv, idx, SCALE)
    assert ref_lse.max() > 100  # exp(100) overflows fp32: the running max must be subtracted
    run_and_check(q, kv, idx, num_splits=2)


def test_heads_not_a_multiple_of_16() -> None:
    q, kv, idx = make(2, 48, heads=20, seed=8)
    idx[0, 30:] = -1
    run_and_check(q, kv, idx, num_splits=2)


def test_empty_batch_launches_nothing() -> None:
    q, kv, idx = make(1, 32)
    out, lse = sd.sparse_mla_decode(q[:0], kv, idx[:0], SCALE, config=CFG)
    assert out.shape == (0, 16, 512) and lse.shape == (0, 16)


def test_fixed_config_bypasses_the_autotuner() -> None:
    q, kv, idx = make(1, 32)
    before = dict(sd._split_kernel.cache)
    run_and_check(q, kv, idx, num_splits=1)
    assert dict(sd._split_kernel.cache) == before


# ---- split count ---------------------------------------------------------------------------------


def test_choose_num_splits_fills_the_sms_and_keeps_128_indices_per_split() -> None:
    for sms in (16, 132):
        for batch in (1, 2, 3, 8, 9, 33, 64, 100, 256):
            for heads in (16, 20, 128):
                for topk in (1, 100, 128, 256, 300, 1024, 2048, 4096):
                    s = sd.choose_num_splits(batch, heads, topk, sms)
                    assert s in (1, 2, 4, 8, 16)
                    assert s == 1 or topk // s >= 128
                    programs = batch * -(-heads // 16)
                    if s > 1:  # the next smaller choice would not fill the SMs
                        assert programs * (s // 2) < sms
                    cap_allows_more = topk // (2 * s) >= 128 and s < 16
                    if cap_allows_more:  # stopped because the SMs are full
                        assert programs * s >= sms
    assert sd.choose_num_splits(64, 16, 2048, 132) == 4  # the spec's example: 64*2 < 132 <= 64*4


# ---- argument validation -------------------------------------------------------------------------


def _noncontig(t: torch.Tensor) -> torch.Tensor:
    wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype, device=t.device)
    view = wide[..., ::2]
    view.copy_(t)
    assert not view.is_contiguous()
    return view


def _with(i: int, value: int):
    def f(idx: torch.Tensor) -> torch.Tensor:
        idx = idx.clone()
        idx[0, i] = value
        return idx

    return f


BAD_ARGS = [
    ("q", lambda a: {**a, "q": a["q"].half()}),
    ("q", lambda a: {**a, "q": a["q"][..., :512].contiguous()}),
    ("q", lambda a: {**a, "q": a["q"][0]}),
    ("q", lambda a: {**a, "q": _noncontig(a["q"])}),
    ("kv_cache", lambda a: {**a, "kv_cache": a["kv_cache"].half()}),
    ("kv_cache", lambda a: {**a, "kv_cache": a["kv_cache"][:, :512].contiguous()}),
    ("kv_cache", lambda a: {**a, "kv_cache": a["kv_cache"][None]}),
    ("kv_cache", lambda a: {**a, "kv_cache": _noncontig(a["kv_cache"])}),
    ("kv_cache", lambda a: {**a, "kv_cache": a["kv_cache"].to("meta")}),
    ("indices", lambda a: {**a, "indices": a["indices"].long()}),
    ("indices", lambda a: {**a, "indices": a["indices"][None]}),
    ("indices", lambda a: {**a, "indices": a["indices"][:1]}),
    ("indices", lambda a: {**a, "indices": _noncontig(a["indices"])}),
    ("indices", lambda a: {**a, "indices": a["indices"].to("meta")}),
    ("indices", lambda a: {**a, "indices": _with(3, SLOTS)(a["indices"])}),
    ("indices", lambda a: {**a, "indices": _with(5, -2)(a["indices"])}),
    ("sm_scale", lambda a: {**a, "sm_scale": 0.0}),
    ("sm_scale", lambda a: {**a, "sm_scale": -0.1}),
    ("sm_scale", lambda a: {**a, "sm_scale": float("nan")}),
    ("sm_scale", lambda a: {**a, "sm_scale": float("inf")}),
    ("sm_scale", lambda a: {**a, "sm_scale": "0.1"}),
    ("k_scale", lambda a: {**a, "k_scale": 0.0}),
    ("k_scale", lambda a: {**a, "k_scale": float("nan")}),
    ("k_scale", lambda a: {**a, "k_scale": True}),
    ("num_splits", lambda a: {**a, "num_splits": 0}),
    ("num_splits", lambda a: {**a, "num_splits": 33}),
    ("num_splits", lambda a: {**a, "num_splits": 2.0}),
    ("config", lambda a: {**a, "config": {"BLOCK_T": 24}}),
    ("config", lambda a: {**a, "config": {"BLOCK_T": 16, "warps": 4}}),
]


def _good_args() -> dict:
    q, kv, idx = make(2, 32, kv_dtype=FP8)
    return {"q": q, "kv_cache": kv, "indices": idx, "sm_scale": SCALE, "k_scale": 1.0, "config": CFG}


@pytest.mark.parametrize(("name", "mutate"), BAD_ARGS)
def test_bad_arguments_raise_value_error_naming_the_argument(name: str, mutate) -> None:
    args = mutate(_good_args())
    with pytest.raises(ValueError, match=f"^{name}: "):
        sd.sparse_mla_decode(**args)


def test_good_arguments_pass_validation() -> None:
    out, _ = sd.sparse_mla_decode(**_good_args())  # the base that every bad case mutates
    assert out.shape == (2, 16, 512)


def test_validate_false_skips_the_range_check_and_never_reads_out_of_bounds() -> None:
    q, kv, idx = make(2, 32, seed=9)
    bad = idx.clone()
    bad[0, 3] = SLOTS + 1000  # far outside the cache
    with pytest.raises(ValueError, match="indices"):
        sd.sparse_mla_decode(q, kv, bad, SCALE, config=CFG)
    out, lse = sd.sparse_mla_decode(q, kv, bad, SCALE, config=CFG, validate=False)
    # Today's behaviour (documented as undefined for the result): the slot is skipped like -1.
    skipped = idx.clone()
    skipped[0, 3] = -1
    ref, ref_lse = sd.reference(q, kv, skipped, SCALE)
    assert rel_err(out, ref, torch.isfinite(ref_lse)) <= 1e-2


# ---- the config list -----------------------------------------------------------------------------


def test_configs_sweep_block_t_warps_stages_and_one_cannot_fit_an_h200() -> None:
    assert len(sd.CONFIGS) >= 13
    shapes = {(c.kwargs["BLOCK_T"], c.num_warps, c.num_stages) for c in sd.CONFIGS}
    assert len(shapes) == len(sd.CONFIGS)  # no duplicates
    over = [c for c in sd.CONFIGS if sd.estimate_shared_memory(c.kwargs["BLOCK_T"], kv_bytes=1) > sd.SM90_MAX_SHARED]
    # Over the limit by the lower bound even for the smaller (fp8) cache, so over on the hardware.
    assert len(over) == 1
    assert len([c for c in sd.CONFIGS if c not in over]) >= 12
    assert all(c.kwargs["BLOCK_T"] & (c.kwargs["BLOCK_T"] - 1) == 0 for c in sd.CONFIGS)


@pytest.mark.skipif(DEV != "cpu", reason="compiles for sm90 offline; on a GPU the GPU tests cover the build")
def test_sm90_build_converts_fp8_in_registers_and_fits_except_the_deliberate_config() -> None:
    """The real sm90 build (ptxas ships with Triton, no GPU needed): the fp8 tile is never read from
    shared memory one byte at a time (Triton's own conversion did that: 256 LDS.U8 per thread per
    block), and the configs fit an H200 except the one listed to fail."""
    from processes import run_json

    fitting = ["64,4,1", "64,4,3", "128,8,1"]
    built = run_json(["sm90_build.py", *fitting, "512,8,3"], timeout=600)
    for cfg in fitting:
        b = built[cfg]
        assert "error" not in b, b
        assert b["shared"] <= sd.SM90_MAX_SHARED, (cfg, b["shared"])
        assert b["ops"].get("F2FP.F16.E4M3.UNPACK_B", 0) > 0, b["ops"]  # the PTX e4m3x2 -> f16x2
        assert not any(op.startswith("LDS.U8") for op in b["ops"]), (cfg, b["ops"])
    assert built["512,8,3"]["shared"] > sd.SM90_MAX_SHARED


# ---- the Hopper (sm90) split stage: checked here by its real build; on the GPU by tests/test_gpu.py --


def test_hopper_configs_sweep_block_t_warps_stages_and_one_cannot_fit_an_h200() -> None:
    shapes = [(c.kwargs["BLOCK_T"], c.kwargs["ROWS"], c.num_warps, c.num_stages) for c in sm90.CONFIGS]
    assert len(set(shapes)) == len(shapes)  # no duplicates
    fitting = [c for c in sm90.CONFIGS if sm90.SHARED_BYTES[c.kwargs["BLOCK_T"]] <= sd.SM90_MAX_SHARED]
    assert len(fitting) >= 12 and len(sm90.CONFIGS) == len(fitting) + 1
    assert {c.num_stages for c in fitting} == {1, 2} and {c.kwargs["BLOCK_T"] for c in fitting} == {64, 128}
    for c in sm90.CONFIGS:  # every tuned winner can be launched again as a fixed config
        assert sm90.check_config(sd._config_dict(c))["STAGES"] == c.num_stages


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"BLOCK_T": 32}, "TUNECACHE_SPARSE_DECODE_GLUON=0"),
        ({"BLOCK_T": 96}, "power of two"),
        ({"BLOCK_T": 64, "num_warps": 8}, "num_warps must be BLOCK_T // 16 = 4"),
        ({"BLOCK_T": 64, "num_stages": 3}, "num_stages must be 1 or 2"),
        ({"BLOCK_T": 64, "ROWS": 3}, "ROWS"),
        ({"BLOCK_T": 64, "num_stages": 1, "STAGES": 2}, "STAGES is num_stages"),
        ({"BLOCK_T": 64, "BLOCK_H": 32}, "unknown keys"),
        ([64, 4, 1], "must be a dict"),
    ],
)
def test_hopper_fixed_config_errors_say_what_the_kernel_accepts(config: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        sm90.check_config(config)  # type: ignore[arg-type]


def test_fp8_on_sm90_runs_the_hopper_kernel_unless_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    kv8, kv16 = torch.zeros(4, sd.D_QK, dtype=FP8), torch.zeros(4, sd.D_QK, dtype=BF16)
    assert not sd._uses_sm90(kv8) and sd.split_kernel(kv8) is sd._split_kernel  # CPU, interpreter
    monkeypatch.setattr(sd, "_is_hopper", lambda device: True)
    monkeypatch.setattr(sd, "_INTERPRETED", False)
    assert sd._uses_sm90(kv8) == sm90.AVAILABLE and not sd._uses_sm90(kv16)
    if sm90.AVAILABLE:
        assert sd.split_kernel(kv8) is sm90.split_kernel
    monkeypatch.setattr(sd, "_GLUON_ENABLED", False)  # TUNECACHE_SPARSE_DECODE_GLUON=0
    assert not sd._uses_sm90(kv8)


def test_hopper_kernel_has_its_own_identity_in_the_store() -> None:
    from tunecache.problem.identity import kernel_identity

    if not sm90.AVAILABLE:
        pytest.skip("Triton without Gluon >= 3.6")
    a, b = kernel_identity(sm90.split_kernel), kernel_identity(sd._split_kernel)
    assert a.name.endswith("sparse_decode_sm90._split_stage_sm90") and a.source_hash != b.source_hash
    assert kernel_identity(sm90.split_kernel).source_hash == a.source_hash


@pytest.mark.skipif(DEV != "cpu" or not sm90.AVAILABLE, reason="compiles for sm90 offline with Gluon")
def test_hopper_build_multiplies_from_shared_memory_and_fits_except_the_deliberate_config() -> None:
    """The real sm90 build of the Gluon kernel: wgmma (HGMMA) with both operands in shared memory,
    so no ldmatrix (the Triton stage's q re-reads); the shared memory of every BLOCK_T is what
    SHARED_BYTES says; two BLOCK_T=64 programs fit an SM; the deliberate config cannot fit."""
    import triton
    from processes import run_json

    built = run_json(["sm90_build.py", "--gluon", "64,4,2,8", "64,4,1,2", "128,8,2,8", "256,16,2,4"], timeout=600)
    for cfg, b in built.items():
        assert "error" not in b, b
        bt = int(cfg.split(",")[0])
        assert b["shared"] == sm90.SHARED_BYTES[bt], (cfg, b["shared"])
        assert b["ops"].get("HGMMA.64", 0) >= 64 and not any(op.startswith("LDSM") for op in b["ops"]), b["ops"]
        assert b["ops"].get("F2FP.F16.E4M3.UNPACK_B", 0) > 0
        if bt < 256 and triton.__version__.startswith("3.6."):
            assert b["stack"] == 0, (cfg, b)  # no spills in the build verified on the H200
    assert 2 * (sm90.SHARED_BYTES[64] + 1024) <= 233472  # 228 KiB per SM, 1 KiB reserved per block
    assert built["256,16,2,4"]["shared"] > sd.SM90_MAX_SHARED


def test_split_partials_are_fp16_only_while_fp8_rows_fit_fp16() -> None:
    kv8 = torch.zeros(4, sd.D_QK, dtype=FP8)
    assert sd._partial_dtype(kv8, 1.0 / 16) == torch.float16
    assert sd._partial_dtype(kv8, 146.0) == torch.float16  # 448 * 146 = 65408 <= 65504
    assert sd._partial_dtype(kv8, 147.0) == torch.float32
    assert sd._partial_dtype(torch.zeros(4, sd.D_QK, dtype=BF16), 1.0) == torch.float32
    assert not sd._has_e4m3_cvt(torch.device("cpu"))


@pytest.mark.parametrize("k_scale", [1.0 / 16, 300.0])
def test_fp8_with_splits_matches_reference_with_fp16_and_fp32_partials(k_scale: float) -> None:
    q, kv, idx = make(2, 128, kv_dtype=FP8)
    idx[0, 100:] = -1
    run_and_check(q, kv, idx, k_scale=k_scale, num_splits=4)


def test_kernel_exposes_the_tuning_key_arguments() -> None:
    assert {"B", "TOPK", "H"} <= set(sd._split_stage.arg_names)
    assert hasattr(sd._split_kernel, "cache")


def test_autotuned_path_stores_the_bucket_and_matches_reference(sqlite_url):
    """Through tunecache.autotune under the interpreter: B=3 tunes bucket 4; a restart is a hit."""
    import tunecache
    from tunecache.store.opening import open_store

    sd._split_kernel.reset(store=sqlite_url)
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(3, 16, 576, generator=gen).to(torch.bfloat16)
    kv = (torch.randn(128, 576, generator=gen) * 0.5).to(torch.bfloat16)
    idx = torch.randint(0, 128, (3, 32), generator=gen, dtype=torch.int32)
    idx[0, 20:] = -1
    out, lse = sd.sparse_mla_decode(q, kv, idx, 0.05)
    ref, ref_lse = sd.reference(q, kv, idx, 0.05)
    assert ((out.float() - ref).abs().max() / ref.abs().max()).item() <= 1e-2
    assert tunecache.stats()["benchmarks"] == len(sd.CONFIGS)
    (p,) = open_store(sqlite_url).find_problems(with_configs=True)
    assert p.batch_bucket == 4 and dict(json.loads(p.key_json))["B"] == 4
    assert len(p.configs) == len(sd.CONFIGS)


def test_warmup_defers_a_bucket_another_host_is_benchmarking_then_comes_back_to_it(tmp_path, monkeypatch):
    """A cold fleet spreads the buckets (tests/test_rollout_spread.py): here bucket 2's lease is another host's
    (which never stores it), so warmup tunes bucket 1 first, then comes back to 2, waits for it in vain
    and tunes it; progress is called once per bucket and every bucket has its winner."""
    import time

    import sqlalchemy as sa

    import tunecache
    from tunecache.store.opening import open_store
    from tunecache.store.schema import leases

    probe = f"sqlite:///{tmp_path / 'probe.sqlite3'}"
    sd._split_kernel.reset(store=probe)
    sd.warmup([2], topk=32)
    (p,) = open_store(probe).find_problems()
    url = f"sqlite:///{tmp_path / 'fleet.sqlite3'}"
    s = open_store(url)
    with s.engine.connect() as c:
        held = {"digest": p.digest, "holder": "h:1:x", "host": "h", "pid": 1, "expires_at": time.time() + 60}
        c.execute(sa.insert(leases).values(**held))
        c.commit()
    monkeypatch.setenv("TUNECACHE_WAIT_SECONDS", "0.2")
    sd._split_kernel.reset(store=url)
    tunecache.reset_stats()
    calls: list[int] = []
    winners = sd.warmup([1, 2], topk=32, progress=lambda b, seconds: calls.append(b))
    assert calls == [1, 2]  # 2 deferred: bucket 1 first
    assert list(winners) == [2, 1] and all(set(w) == {"BLOCK_T", "num_warps", "num_stages"} for w in winners.values())
    st = tunecache.stats()
    assert st["waits"] == 1 and st["misses"] == 2 and st["benchmarks"] == 2 * len(sd.CONFIGS)
