"""The split stage of the sparse MLA decode kernel for Hopper (sm90), in Gluon: the fp8 path on H100/H200.

Same arguments, semantics and outputs as the portable Triton split stage
(:func:`tunecache.kernels.sparse_decode._split_stage`), so the same wrapper, merge stage and tests
serve both; :func:`tunecache.kernels.sparse_decode.sparse_mla_decode` picks this one for an fp8
cache on a CUDA device of compute capability 9.x.

Why a second implementation. With 16 heads per program the Triton stage runs ``mma.sync`` with the
heads as M: every warp re-reads the whole q tile (18 KB) from shared memory for every block of
gathered rows, and the kernel stalls at two warps per scheduler (docs/benchmarks/sparse-kernel.md has
the Nsight Compute profile). Hopper's ``wgmma`` needs M >= 64, so the gathered rows must be the M side,
``S^T = K q^T`` and ``O^T = V^T P^T``; Triton does pick wgmma for that form, but keeps an A operand
that does not come straight from a load (ours is converted from fp8 in registers) in registers:
144 registers per thread for K, 128 for V^T, and the build spills. Gluon states where each tensor
lives, so here:

- the gathered block is converted to fp16 once and stored to shared memory in the layout wgmma
  reads (128-byte swizzle); both products take both operands from shared memory, and V^T is a
  transposed view of the same tile, so nothing is stored twice and q is read once per warpgroup;
- the next block's rows are gathered into registers while this block is multiplied
  (``STAGES=2``; ``STAGES=1`` gathers after the products, for fewer live registers);
- the gather layout is a tuning parameter: ``ROWS`` rows per warp instruction, 16-byte loads
  (on an H200, 8 rows: 46.6 us at B=64; 4 rows: 53; 16 rows: 59).

Measured on an H200 (Triton 3.6, split + merge in a CUDA graph, H=16, topk=2048, fp8; the best
config, BLOCK_T=64, 4 warps, 2 stages, ROWS=8): B=64 0.0466 ms (1.62 TB/s of gathered rows)
against 0.0528 ms for the Triton stage in the same run, B=256 0.144 ms (2.09 TB/s) against
0.174 ms; at B <= 32 the two are within 6% either way. docs/benchmarks/sparse-kernel.md has the sweeps.

Gluon is experimental and its API moves between releases (3.9 renamed ``thread_barrier`` to
``barrier``). This kernel is verified on an H200 with Triton 3.6 and compiles for sm90 with 3.6 and
3.9 (tests/test_sparse_decode.py builds it offline); before 3.6, or with
``TUNECACHE_SPARSE_DECODE_GLUON=0``, the Triton stage runs instead.
"""

from __future__ import annotations

import triton

from tunecache import autotune, buckets

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
except ImportError:  # Triton without Gluon
    gluon = None

__all__ = ["AVAILABLE", "CONFIGS", "SHARED_BYTES", "check_config", "split_kernel", "split_stage"]


def _triton_at_least(major: int, minor: int) -> bool:
    try:
        got = tuple(int(x) for x in triton.__version__.split(".")[:2])
    except ValueError:
        return False
    return got >= (major, minor)


# Where this kernel may run at all; the wrapper adds the device and dtype checks.
AVAILABLE = gluon is not None and _triton_at_least(3, 6)

# 12 configs that fit an H200 plus one that cannot, so that the autotuner's OutOfResources path
# runs on real hardware. wgmma needs 64 rows per warpgroup, hence num_warps = BLOCK_T // 16. A Gluon
# kernel is not pipelined by the compiler, so num_stages reaches it as the constexpr STAGES (blocks
# of rows in flight), kept equal to num_stages. Shared memory per program, compiled for sm90
# (Triton 3.6): the q tile (18 KB), the fp16 block and P^T. BLOCK_T=64 fits two programs per SM
# (2 x 94464 bytes); BLOCK_T=256 (16 warps) needs 322560 bytes, over the 232448 an H200 gives a block.
SHARED_BYTES = {64: 94464, 128: 170496, 256: 322560}
_FITTING = [(64, 4), (128, 8)]
CONFIGS: list[triton.Config] = [
    triton.Config({"BLOCK_T": bt, "ROWS": rows, "STAGES": stages}, num_warps=w, num_stages=stages)
    for bt, w in _FITTING
    for stages in (2, 1)
    for rows in (8, 4, 2)
] + [triton.Config({"BLOCK_T": 256, "ROWS": 4, "STAGES": 2}, num_warps=16, num_stages=2)]


def check_config(config: dict) -> dict:
    """A fixed config (``{"BLOCK_T", "num_warps", "num_stages", "ROWS"}``) as launch kwargs, or a
    ValueError that says what this kernel accepts."""
    if not isinstance(config, dict) or "BLOCK_T" not in config:
        raise ValueError(f"config: must be a dict with BLOCK_T (and num_warps, num_stages, ROWS), got {config!r}")
    extra = set(config) - {"BLOCK_T", "num_warps", "num_stages", "ROWS", "STAGES"}
    if extra:
        raise ValueError(f"config: unknown keys {sorted(extra)}")
    bt = config["BLOCK_T"]
    if not isinstance(bt, int) or isinstance(bt, bool) or bt < 64 or bt & (bt - 1):
        raise ValueError(
            f"config: the Hopper fp8 kernel needs BLOCK_T a power of two >= 64 (wgmma takes 64 rows per "
            f"warpgroup), got {bt!r}; set TUNECACHE_SPARSE_DECODE_GLUON=0 to run the Triton kernel instead"
        )
    cfg = {"num_warps": bt // 16, "num_stages": config.get("STAGES", 2), "ROWS": 8, **config}
    if cfg["num_warps"] != bt // 16:
        raise ValueError(f"config: num_warps must be BLOCK_T // 16 = {bt // 16} here, got {cfg['num_warps']!r}")
    if cfg["num_stages"] not in (1, 2):
        raise ValueError(f"config: num_stages must be 1 or 2 (blocks of rows in flight), got {cfg['num_stages']!r}")
    if cfg.get("STAGES", cfg["num_stages"]) != cfg["num_stages"]:
        raise ValueError(f"config: STAGES is num_stages; got {cfg['STAGES']!r} and {cfg['num_stages']!r}")
    if cfg["ROWS"] not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"config: ROWS must be a power of two <= 32, got {cfg['ROWS']!r}")
    return {**cfg, "STAGES": cfg["num_stages"]}


if gluon is not None:
    # Triton 3.9 renamed gl.thread_barrier to gl.barrier (same bar.sync).
    _barrier = getattr(gl, "thread_barrier", None) or gl.barrier
    _CVT = gl.constexpr(
        "{.reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi;}"
    )

    @gluon.jit
    def _e4m3_to_fp16(x):
        """e4m3 -> fp16 in registers, one PTX instruction per pair (as the Triton stage does)."""
        return gl.inline_asm_elementwise(_CVT, "=r,=r,r", [x], dtype=gl.float16, is_pure=False, pack=4)

    @gluon.jit
    def _gather(KV, idx, offs_c, stride_kv, SLOTS):
        """Rows ``idx`` of the cache, columns ``offs_c``; -1 and out-of-range indices read nothing
        and give 0 (a NaN behind a masked lane must not reach P @ V). 64-bit row offsets: 32-bit
        ones measured no faster here (H200, B=64: 46.6 against 46.7 us)."""
        valid = (idx >= 0) & (idx < SLOTS)
        row = gl.where(valid, idx, 0).to(gl.int64) * stride_kv
        return gl.load(KV + row[:, None] + offs_c[None, :], mask=valid[:, None], other=0.0)

    @gluon.jit(do_not_specialize=["B", "stride_lb", "stride_lh", "stride_ls"])
    def _split_stage_sm90(
        Q,
        KV,
        IDX,
        O_PART,
        LSE_PART,
        sm_scale,
        k_scale,
        stride_qb,
        stride_qh,
        stride_kv,
        stride_ib,
        stride_ob,
        stride_oh,
        stride_os,
        stride_lb,
        stride_lh,
        stride_ls,
        B,  # not used in the body: present (by this name) for the autotuner's key
        TOPK,
        H,
        SLOTS,
        CHUNK,
        BLOCK_H: gl.constexpr,
        BLOCK_T: gl.constexpr,
        D_V: gl.constexpr,
        D_ROPE: gl.constexpr,
        ROWS: gl.constexpr,
        STAGES: gl.constexpr,
    ):
        """One (query, 16 heads, chunk of indices) with the rows on wgmma's M side: partial o + lse."""
        LOG2E: gl.constexpr = 1.4426950408889634
        LN2: gl.constexpr = 0.6931471805599453
        W: gl.constexpr = gl.num_warps()
        MMA: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[W, 1], instr_shape=[16, BLOCK_H, 16]
        )
        GN: gl.constexpr = gl.BlockedLayout([1, 16], [ROWS, 32 // ROWS], [W, 1], [1, 0])  # [BLOCK_T, 512] fp8
        GR: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [W, 1], [1, 0])  # [BLOCK_T, 64] fp8
        QN: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [W, 1], [1, 0])  # [16, 512] bf16
        QR: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [W, 1], [1, 0])  # [16, 64] bf16
        SH: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        SH_P: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=32, element_bitwidth=16, rank=2)

        pid_b = gl.program_id(0)
        pid_h = gl.program_id(1)
        pid_s = gl.program_id(2)

        # q of 16 heads, as fp16, in shared memory once: wgmma's B operand of S^T = K q^T.
        hq = pid_h * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, QN))
        dq = gl.arange(0, D_V, layout=gl.SliceLayout(0, QN))
        q_base = Q + pid_b * stride_qb
        q_nope = gl.load(q_base + hq[:, None] * stride_qh + dq[None, :], mask=(hq < H)[:, None], other=0.0)
        hr = pid_h * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, QR))
        dr = D_V + gl.arange(0, D_ROPE, layout=gl.SliceLayout(0, QR))
        q_rope = gl.load(q_base + hr[:, None] * stride_qh + dr[None, :], mask=(hr < H)[:, None], other=0.0)
        qn_smem = gl.allocate_shared_memory(gl.float16, [BLOCK_H, D_V], SH, q_nope.to(gl.float16))
        qr_smem = gl.allocate_shared_memory(gl.float16, [BLOCK_H, D_ROPE], SH, q_rope.to(gl.float16))
        kn_smem = gl.allocate_shared_memory(gl.float16, [BLOCK_T, D_V], SH)
        kr_smem = gl.allocate_shared_memory(gl.float16, [BLOCK_T, D_ROPE], SH)
        p_smem = gl.allocate_shared_memory(gl.float16, [BLOCK_T, BLOCK_H], SH_P)

        offs_n = gl.arange(0, D_V, layout=gl.SliceLayout(0, GN))
        offs_r = D_V + gl.arange(0, D_ROPE, layout=gl.SliceLayout(0, GR))
        tn = gl.arange(0, BLOCK_T, layout=gl.SliceLayout(1, GN))
        tr = gl.arange(0, BLOCK_T, layout=gl.SliceLayout(1, GR))
        tm = gl.arange(0, BLOCK_T, layout=gl.SliceLayout(1, MMA))

        idx_base = IDX + pid_b * stride_ib
        start = pid_s * CHUNK
        end = gl.minimum(start + CHUNK, TOPK)

        # exp2 with log2(e) folded into the scale; k_scale dequantises fp8 K inside the scores.
        qk_scale = sm_scale * k_scale * LOG2E
        m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, layout=gl.SliceLayout(0, MMA))
        # The softmax denominator per (row lane, head), summed once after the loop.
        l_t = gl.zeros([BLOCK_T, BLOCK_H], gl.float32, layout=MMA)
        acc = gl.zeros([D_V, BLOCK_H], gl.float32, layout=MMA)  # O^T

        # The first block, converted into shared memory.
        i_n = gl.load(idx_base + start + tn, mask=start + tn < end, other=-1)
        i_r = gl.load(idx_base + start + tr, mask=start + tr < end, other=-1)
        kn_smem.store(_e4m3_to_fp16(_gather(KV, i_n, offs_n, stride_kv, SLOTS)))
        kr_smem.store(_e4m3_to_fp16(_gather(KV, i_r, offs_r, stride_kv, SLOTS)))
        fence_async_shared()
        _barrier()
        for t0 in range(start, end, BLOCK_T):
            t1 = t0 + BLOCK_T
            if STAGES == 2:
                # The next block's rows: in flight, in registers, while this block is multiplied.
                i_n = gl.load(idx_base + t1 + tn, mask=t1 + tn < end, other=-1)
                i_r = gl.load(idx_base + t1 + tr, mask=t1 + tr < end, other=-1)
                kn = _gather(KV, i_n, offs_n, stride_kv, SLOTS)
                kr = _gather(KV, i_r, offs_r, stride_kv, SLOTS)
            i_m = gl.load(idx_base + t0 + tm, mask=t0 + tm < end, other=-1)
            s = gl.zeros([BLOCK_T, BLOCK_H], gl.float32, layout=MMA)
            s = warpgroup_mma(kr_smem, qr_smem.permute([1, 0]), s, is_async=True)
            s = warpgroup_mma(kn_smem, qn_smem.permute([1, 0]), s, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=0, deps=[s])
            valid = (i_m >= 0) & (i_m < SLOTS)
            s = gl.where(valid[:, None], s * qk_scale, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(s, 0))
            # While nothing valid has been seen m_new is -inf: subtract 0 instead, so that
            # exp2(-inf - -inf) never makes a NaN; alpha and p are then exactly 0.
            m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = gl.exp2(m_i - m_safe)
            p = gl.exp2(s - m_safe[None, :])
            l_t = l_t * alpha[None, :] + p
            p_smem.store(p.to(gl.float16))
            fence_async_shared()
            _barrier()
            # V^T is the transposed view of the same fp16 tile: no second gather, no second store.
            acc = warpgroup_mma(kn_smem.permute([1, 0]), p_smem, acc * alpha[None, :], is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
            m_i = m_new
            if STAGES == 1:
                i_n = gl.load(idx_base + t1 + tn, mask=t1 + tn < end, other=-1)
                i_r = gl.load(idx_base + t1 + tr, mask=t1 + tr < end, other=-1)
                kn = _gather(KV, i_n, offs_n, stride_kv, SLOTS)
                kr = _gather(KV, i_r, offs_r, stride_kv, SLOTS)
            _barrier()  # every warp's wgmma has read this block before it is overwritten
            kn_smem.store(_e4m3_to_fp16(kn))
            kr_smem.store(_e4m3_to_fp16(kr))
            fence_async_shared()
            _barrier()

        l_i = gl.sum(l_t, 0)
        empty = l_i == 0.0  # l_i >= 1 as soon as one index was valid
        l_safe = gl.where(empty, 1.0, l_i)
        o = acc * (k_scale / l_safe)[None, :]
        lse = gl.where(empty, float("-inf"), (m_i + gl.log2(l_safe)) * LN2)
        ho = pid_h * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(0, MMA))
        do = gl.arange(0, D_V, layout=gl.SliceLayout(1, MMA))
        o_ptr = O_PART + pid_b * stride_ob + ho[None, :] * stride_oh + pid_s * stride_os + do[:, None]
        gl.store(o_ptr, o.to(O_PART.dtype.element_ty), mask=(ho < H)[None, :])
        gl.store(LSE_PART + pid_b * stride_lb + ho * stride_lh + pid_s * stride_ls, lse, mask=ho < H)

    split_stage = _split_stage_sm90
    # Keyed like the Triton stage (SGLang's batch bucket, topk, H; Triton appends the dtypes). A
    # separate kernel, so a separate identity in the store: its rows never mix with the Triton
    # stage's.
    split_kernel = autotune(configs=CONFIGS, key=["B", "TOPK", "H"], bucket={"B": buckets.sglang})(_split_stage_sm90)
else:  # pragma: no cover - Triton without Gluon
    split_stage = None
    split_kernel = None
