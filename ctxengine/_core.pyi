"""ctx-engine native decode core (native/, bound in native/*/register_*.cpp).

Kept in step with the module by tests/test_core_stub.py: every name here
exists in the built module and every public name there is declared here.
"""
from typing import Any, Optional

import numpy as np
import numpy.typing as npt

_F32 = npt.ArrayLike  # converted to C-contiguous float32 (a copy when needed)
_U16 = npt.ArrayLike  # converted to C-contiguous uint16 (f16 bit patterns)
_I8 = npt.ArrayLike   # converted to C-contiguous int8

# -- SIMD path (native/core/register_cpu.cpp) ---------------------------------

def detect_isa() -> str:
    """Best SIMD path this CPU supports: 'scalar', 'avx2' or 'avx512'."""
def active_isa() -> str:
    """SIMD path in use."""
def set_isa(name: str) -> None:
    """Force a path (all paths give bit-identical results); ValueError if the CPU lacks it."""
def isa_features(name: str) -> list[tuple[str, str]]:
    """[(compiler name, /proc/cpuinfo flag)] of every feature the path is compiled with."""

def parallel_chunks(n: int, grain: int, threads: int, guided: bool) -> list[tuple[int, int]]:
    """The chunks a fresh thread pool hands out over [0, n), in the order they were claimed (tests)."""

# -- mapped files read past their end (native/core/mapping_guard.cpp) -----------

def guard_mapping(address: int, size: int, what: str, why: str) -> None:
    """Say ``what`` and ``why`` on stderr if a read of [address, address + size) raises SIGBUS, then die as before."""
def unguard_mapping(address: int) -> None:
    """Forget a mapping ``guard_mapping`` registered."""

# -- GGUF reading (native/core/register_gguf.cpp) --------------------------------

def gguf_skip_strings(buf: Any, size: int, pos: int, count: int) -> tuple[int, int]:
    """(offset past the last whole string, how many were whole) of ``count`` GGUF strings from
    ``pos`` in the first ``size`` bytes of buf (bytes, an mmap: any buffer), decoding none
    (a header-only read's vocabulary walk)."""

# -- elementwise and attention kernels, for tests (native/models/register_model.cpp) --

def exp_shift_sum(x: _F32, shift: float) -> tuple[npt.NDArray[np.float32], float]:
    """(exp(x - shift), its sum) with the engine's canonical exp."""
def silu_mul(g: _F32, u: _F32) -> npt.NDArray[np.float32]:
    """silu(g) * u."""
def rmsnorm_rows(x: _F32, w: _F32, eps: float) -> npt.NDArray[np.float32]:
    """RMS norm of each row of x (rows, n), times w, as llama.cpp computes it."""
def rope(v: _F32, cs: _F32, neox: bool) -> npt.NDArray[np.float32]:
    """RoPE of each head (row of v) by one position's angles cs (cos[half], then sin[half])."""
def gelu_mul(g: _F32, u: _F32) -> npt.NDArray[np.float32]:
    """gelu(g) * u (the tanh GELU by llama.cpp's f16 table)."""
def attn_scores(q: _F32, kt: _U16, n: int, scale: float) -> npt.NDArray[np.float32]:
    """Scores of n keys of a page's f16 K block kt (head_dim, stride)."""
def attn_softmax_v(scores: _F32, v: _U16, out: _F32) -> tuple[npt.NDArray[np.float32], float]:
    """(out + softmax(scores) . v, max score); v: (n, head_dim) f16 rows."""
def attn_group(q: _F32, kt: _U16, kq: _I8, ks: _U16, p: _F32, v: _U16, vq: _I8, vs: _U16, n: int,
               scale: float, counts: npt.NDArray[np.int32] | None = None,
               shared: int = 0, hot: bool = False) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """A group of heads (q: (g, hd)) through the grouped kernels: scores of one page's K, weights p (g, n) . V
    (hot: the pages taken as in cache, as for a prompt's rows; the same bits)."""
def attn_scores_q8(q: _F32, kq: _I8, ks: _U16, n: int, scale: float) -> npt.NDArray[np.float32]:
    """Scores of n keys of a q8 page's K block: kq (head_dim, stride), ks (head_dim / 32, stride)."""
def attn_softmax_v_q8(scores: _F32, vq: _I8, vs: _U16, out: _F32) -> tuple[npt.NDArray[np.float32], float]:
    """Like attn_softmax_v with V as int8 rows vq (n, head_dim) and f16 scales vs (n, head_dim / 32)."""

# -- KV pages (native/kv/register_kv.cpp) ---------------------------------------

class PagePool:
    """Fixed-size KV pages with reference counts."""
    def __init__(self, n_layer: int, page_tokens: int, kv_dim: int, kv_dtype: str, max_pages: int) -> None:
        """kv_dtype: 'f16', 'q8' (K and V int8 with f16 scales per 32) or 'vq8' (K f16, V int8)."""
    @property
    def page_bytes(self) -> int: ...
    @property
    def kv_dtype(self) -> str: ...
    @property
    def page_tokens(self) -> int: ...
    @property
    def max_pages(self) -> int: ...
    @property
    def n_used(self) -> int: ...
    @property
    def n_allocated(self) -> int: ...
    def refcount(self, page: int) -> int: ...
    def export_page(self, page: int) -> bytes:
        """Raw bytes of a page (what the store hashes and keeps)."""
    def import_page(self, raw: bytes) -> int:
        """A new page (refcount 1) holding these bytes; release it when attached."""
    def release(self, page: int) -> None:
        """Drop one reference."""

class KVSeq:
    """A sequence's page table: ordered page ids and a token count."""
    def __init__(self, pool: PagePool, trim_pool: Optional[PagePool] = None, window: int = 0,
                 keep_layers: list[int] = ...) -> None:
        """With trim_pool, pages wholly outside a `window`-token sliding window keep only keep_layers."""
    @property
    def n_tokens(self) -> int: ...
    @property
    def n_released(self) -> int:
        """Leading pages held released (in the trim pool)."""
    def release_target(self, n_tokens: int) -> int:
        """How many leading pages a sequence of n tokens keeps released."""
    def can_truncate(self, n_tokens: int) -> bool:
        """Whether truncate(n) keeps every page the sliding window at n needs."""
    def defer_release(self, defer: bool) -> None:
        """While deferred, appends release no page (rows that may be truncated away);
        ending it releases what the length then calls for."""
    @property
    def release_deferred(self) -> bool: ...
    @property
    def pages(self) -> list[int]: ...
    @property
    def pool(self) -> PagePool: ...
    def fork(self) -> "KVSeq":
        """Share every page copy-on-write: O(pages), no KV bytes copied."""
    def truncate(self, n_tokens: int) -> None:
        """Keep the first n tokens; refused (a full pool), the sequence is left as it was."""
    def pages_to_truncate(self, n_tokens: int) -> int:
        """Pages truncate(n) takes from the pool (its copy-on-write page): room to make first."""
    def append_page(self, page: int, n_valid: int, released: bool = False) -> None:
        """Attach a page (takes its own reference); released: a trim-pool page, before every full one."""
    def export_page(self, index: int) -> bytes: ...

# -- the model (native/models/register_model.cpp) ---------------------------------

# (seq, tokens int32[n], logits float32[rows, n_vocab] | None, all_logits, hidden float32[n, n_embd] | None
#  [, [(LoraAdapter, scale), ...] | None: the sequence's adapters, added in this order])
_BatchItem = tuple  # of 5 or 6 as above

class LoraAdapter:
    """A LoRA adapter's A and B matrices for one Model (native/models/lora.h)."""
    def __init__(self, model: Model, alpha: float) -> None: ...
    def set(self, layer: int, target: str, a: npt.NDArray[Any], a_type: int, b: npt.NDArray[Any],
            b_type: int) -> None:
        """target: attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up or ffn_down;
        a: (rank, n_in) as a_type's rows (ggml type number: F32 float32, F16 float16 or uint16
        bits, BF16 uint16 bits, Q8_0 uint8 block bytes), b: (n_out, rank) as b_type (F32, F16 or
        BF16 likewise); kept in those types (an array of another element is refused);
        ValueError naming the matrix if they do not fit."""
    @property
    def n_matrices(self) -> int: ...
    @property
    def n_bytes(self) -> int:
        """What its matrices hold in memory."""

def lora_up(bt: _F32, t: _F32, factor: float, y: _F32, o0: int, o1: int, *,
            bf16: bool = False) -> npt.NDArray[np.float32]:
    """y + factor * (t . bt) for outputs [o0, o1) by the active path's kernel (models/lora_kernels.h);
    a float16 bt goes through lora_up_f16, a uint16 one of bf16 bits (bf16=True) through lora_up_bf16."""

class Model:
    """A decoder-only transformer over mapped GGUF weights."""
    def __init__(self, config: dict, tensors: dict[str, tuple[int, int, int, int]], n_threads: int) -> None:
        """tensors: name -> (ggml type, address, ne0, ne1) into a memory map the caller keeps alive."""
    @property
    def n_threads(self) -> int: ...
    @property
    def n_vocab(self) -> int: ...
    @property
    def n_embd(self) -> int: ...
    @property
    def n_layer(self) -> int: ...
    @property
    def kv_dim(self) -> int: ...
    @property
    def repacked_bytes(self) -> int:
        """Bytes of the weights' copies laid out for decode (config "repack_budget":
        at most that many, the output matrix first; default 512 MiB)."""
    def forward(self, batch: list[_BatchItem]) -> None:
        """Run one step for every item (GIL released); appends KV to each seq, fills the buffers."""
    def page_bytes(self, page_tokens: int, kv_dtype: str = "f16") -> int:
        """Bytes of one page; ValueError for a KV dtype this model's shape cannot take."""

# -- ctxengine._core.quant (native/quant/register_quant.cpp) ------------------------

class _Quant:
    """The submodule ``quant``: weight formats and dot-product kernels (for tests and tools)."""
    @staticmethod
    def supported_types() -> list[int]:
        """GGML type ids the kernels handle."""
    @staticmethod
    def dtype_name(ggml_type: int) -> str: ...
    @staticmethod
    def row_bytes(ggml_type: int, n: int) -> int:
        """Bytes of one row of n elements."""
    @staticmethod
    def matmul(ggml_type: int, W: npt.ArrayLike, n_in: int, n_out: int, X: _F32, o0: int = 0,
               o1: int = -1, chunk: int = 0, *, float_x: bool = False,
               x8: npt.ArrayLike | None = None) -> npt.NDArray[np.float32]:
        """Y (n_x, n_out) = X . W^T; W: raw row-major weight bytes; quantized types quantize X to Q8A / Q8K
        first, except Q8_0 with float_x=True (matmul_f: each weight widened exactly, as LoRA's A). Only columns [o0, o1) (o1 = -1: n_out) are computed, as one thread's share; the rest are 0.
        chunk > 0: the kernel is called per `chunk` output rows of that range (the integer types' calls
        share one activation id, so the prefill tiles lay X out once per thread, as in the model).
        x8: W repacked by repack_x8, which the path reads where it has a kernel for it (1-2 rows),
        as the model does."""
    @staticmethod
    def repack_x8(ggml_type: int, W: npt.ArrayLike, n_in: int, n_out: int) -> npt.NDArray[np.uint8]:
        """Rows of a blocks-of-32 type -> decode's layout, 8 rows a group (quant.h): matmul's x8."""
    @staticmethod
    def quantize_q8a(x: _F32) -> bytes:
        """One activation row -> raw BlockQ8A bytes (40 per 32 elements)."""
    @staticmethod
    def quantize_q8k(x: _F32) -> bytes:
        """One activation row -> raw BlockQ8K bytes (292 per 256 elements)."""
    @staticmethod
    def quantize_kv8(x: _F32) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.uint16]]:
        """One K or V row -> (int8 values, f16 scale bits per 32), as q8 KV pages store it."""
    @staticmethod
    def dequantize(ggml_type: int, data: npt.ArrayLike, n: int) -> npt.NDArray[np.float32]:
        """One row -> float32."""
    @staticmethod
    def f32_to_f16(x: _F32) -> npt.NDArray[np.uint16]:
        """Round to f16 bits (round to nearest even), same shape."""
    @staticmethod
    def round_act(x: _F32, to: str) -> npt.NDArray[np.float32]:
        """x rounded to f16 or bf16 ('f16', 'bf16') and widened back, as F16 / BF16 matmuls take their
        activations (quant.h)."""
    @staticmethod
    def prefill_tiles() -> str:
        """The AVX-512 prefill's tile form: 'zmm' (two pairs a register, where 512-bit units are whole) or 'ymm'."""
    @staticmethod
    def set_prefill_tiles(name: str) -> None:
        """Force the AVX-512 prefill's tile form, 'ymm' or 'zmm' (both give the same bits; tests force each)."""
    @staticmethod
    def avx2_vnni() -> bool:
        """Whether the AVX2 path's prefill uses AVX-VNNI (by default, where the CPU has it)."""
    @staticmethod
    def set_avx2_vnni(on: bool) -> None:
        """Force the AVX2 path's prefill with or without AVX-VNNI (the same bits; ValueError where the CPU lacks it)."""

quant: _Quant
