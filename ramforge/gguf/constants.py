"""GGUF and ggml constants: enums, the block-size table, and key templates.

Ids match ggml's `enum ggml_type` and GGUF's `enum gguf_type`; these are file-format facts.
"""
from __future__ import annotations

from enum import IntEnum

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
GGUF_DEFAULT_ALIGNMENT = 32
GGUF_MAX_ALIGNMENT = 1 << 20
GGML_MAX_DIMS = 4
GGML_MAX_NAME = 64          # a tensor name must be shorter than this, as in ggml
QK_K = 256                  # super-block size of the K-quants


class GGUFValueType(IntEnum):
    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# scalar value type -> (struct format, size in bytes, numpy dtype string)
GGUF_SCALAR = {
    GGUFValueType.UINT8: ("<B", 1, "<u1"),
    GGUFValueType.INT8: ("<b", 1, "<i1"),
    GGUFValueType.UINT16: ("<H", 2, "<u2"),
    GGUFValueType.INT16: ("<h", 2, "<i2"),
    GGUFValueType.UINT32: ("<I", 4, "<u4"),
    GGUFValueType.INT32: ("<i", 4, "<i4"),
    GGUFValueType.FLOAT32: ("<f", 4, "<f4"),
    GGUFValueType.BOOL: ("<?", 1, "<u1"),
    GGUFValueType.UINT64: ("<Q", 8, "<u8"),
    GGUFValueType.INT64: ("<q", 8, "<i8"),
    GGUFValueType.FLOAT64: ("<d", 8, "<f8"),
}


class GGMLType(IntEnum):
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39


# ggml type -> (elements per block, bytes per block). The bytes spell out the block layout.
GGML_BLOCK: dict[GGMLType, tuple[int, int]] = {
    GGMLType.F32: (1, 4),
    GGMLType.F16: (1, 2),
    GGMLType.BF16: (1, 2),
    GGMLType.F64: (1, 8),
    GGMLType.I8: (1, 1),
    GGMLType.I16: (1, 2),
    GGMLType.I32: (1, 4),
    GGMLType.I64: (1, 8),
    GGMLType.Q4_0: (32, 2 + 32 // 2),                      # d, 4-bit quants
    GGMLType.Q4_1: (32, 2 + 2 + 32 // 2),                  # d, m, 4-bit quants
    GGMLType.Q5_0: (32, 2 + 4 + 32 // 2),                  # d, high bits, low nibbles
    GGMLType.Q5_1: (32, 2 + 2 + 4 + 32 // 2),              # d, m, high bits, low nibbles
    GGMLType.Q8_0: (32, 2 + 32),                           # d, int8 quants
    GGMLType.Q8_1: (32, 4 + 4 + 32),                       # d, s, int8 quants
    GGMLType.Q2_K: (QK_K, 2 + 2 + QK_K // 16 + QK_K // 4),  # d, dmin, scales, 2-bit quants
    GGMLType.Q3_K: (QK_K, 2 + QK_K // 4 + QK_K // 8 + 12),  # d, 2-bit quants, high mask, scales
    GGMLType.Q4_K: (QK_K, 2 + 2 + QK_K // 2 + 12),          # d, dmin, 6-bit scales, 4-bit quants
    GGMLType.Q5_K: (QK_K, 2 + 2 + QK_K // 2 + QK_K // 8 + 12),  # + high bits
    GGMLType.Q6_K: (QK_K, 2 + QK_K // 16 + 3 * QK_K // 4),  # low 4 bits, high 2 bits, scales, d
    GGMLType.Q8_K: (QK_K, 4 + QK_K + QK_K // 8),            # f32 d, int8 quants, int16 bsums
    GGMLType.IQ2_XXS: (QK_K, 2 + QK_K // 4),
    GGMLType.IQ2_XS: (QK_K, 2 + QK_K // 4 + QK_K // 32),
    GGMLType.IQ3_XXS: (QK_K, 2 + QK_K // 4 + QK_K // 8),
    GGMLType.IQ1_S: (QK_K, 2 + QK_K // 8 + QK_K // 16),
    GGMLType.IQ4_NL: (32, 2 + 32 // 2),                    # d, 4-bit indices into a codebook
    GGMLType.IQ3_S: (QK_K, 2 + QK_K // 4 + QK_K // 8 + QK_K // 32 + 4),
    GGMLType.IQ2_S: (QK_K, 2 + QK_K // 4 + QK_K // 16),
    GGMLType.IQ4_XS: (QK_K, 2 + 2 + QK_K // 64 + QK_K // 2),  # d, scales_h, scales_l, indices
    GGMLType.IQ1_M: (QK_K, QK_K // 8 + QK_K // 16 + QK_K // 32),
    GGMLType.TQ1_0: (QK_K, 2 + 4 * 13),
    GGMLType.TQ2_0: (QK_K, 2 + 64),
    GGMLType.MXFP4: (32, 1 + 16),
}


def row_nbytes(ggml_type: GGMLType, n_elements: int) -> int:
    """Bytes of n_elements of ggml_type (a row, a tensor); ValueError unless they fill whole blocks."""
    block, size = GGML_BLOCK[ggml_type]
    if n_elements % block:
        raise ValueError(f"{ggml_type.name} stores blocks of {block} elements; {n_elements} is not a multiple of {block}")
    return n_elements // block * size


class Keys:
    """GGUF metadata keys; `{arch}` is filled from general.architecture."""

    ARCHITECTURE = "general.architecture"
    ALIGNMENT = "general.alignment"
    NAME = "general.name"
    FILE_TYPE = "general.file_type"

    CONTEXT_LENGTH = "{arch}.context_length"
    EMBEDDING_LENGTH = "{arch}.embedding_length"
    BLOCK_COUNT = "{arch}.block_count"
    FEED_FORWARD_LENGTH = "{arch}.feed_forward_length"
    VOCAB_SIZE = "{arch}.vocab_size"
    HEAD_COUNT = "{arch}.attention.head_count"
    HEAD_COUNT_KV = "{arch}.attention.head_count_kv"
    KEY_LENGTH = "{arch}.attention.key_length"
    VALUE_LENGTH = "{arch}.attention.value_length"
    LAYERNORM_RMS_EPS = "{arch}.attention.layer_norm_rms_epsilon"
    SLIDING_WINDOW = "{arch}.attention.sliding_window"
    ATTN_LOGIT_SOFTCAPPING = "{arch}.attn_logit_softcapping"
    FINAL_LOGIT_SOFTCAPPING = "{arch}.final_logit_softcapping"
    ROPE_FREQ_BASE = "{arch}.rope.freq_base"
    ROPE_DIMENSION_COUNT = "{arch}.rope.dimension_count"
    ROPE_SCALING_TYPE = "{arch}.rope.scaling.type"
    ROPE_SCALING_FACTOR = "{arch}.rope.scaling.factor"
    ROPE_SCALE_LINEAR = "{arch}.rope.scale_linear"                  # the factor's old name
    ROPE_SCALING_ATTN_FACTOR = "{arch}.rope.scaling.attn_factor"
    ROPE_SCALING_ORIG_CTX_LEN = "{arch}.rope.scaling.original_context_length"
    ROPE_SCALING_YARN_EXT_FACTOR = "{arch}.rope.scaling.yarn_ext_factor"
    ROPE_SCALING_YARN_ATTN_FACTOR = "{arch}.rope.scaling.yarn_attn_factor"
    ROPE_SCALING_YARN_BETA_FAST = "{arch}.rope.scaling.yarn_beta_fast"
    ROPE_SCALING_YARN_BETA_SLOW = "{arch}.rope.scaling.yarn_beta_slow"
    ROPE_SCALING_YARN_LOG_MUL = "{arch}.rope.scaling.yarn_log_multiplier"
    EXPERT_COUNT = "{arch}.expert_count"
    EXPERT_USED_COUNT = "{arch}.expert_used_count"
    EXPERT_FEED_FORWARD_LENGTH = "{arch}.expert_feed_forward_length"
    EXPERT_SHARED_FEED_FORWARD_LENGTH = "{arch}.expert_shared_feed_forward_length"
    EXPERT_GROUP_COUNT = "{arch}.expert_group_count"

    TOKENIZER_MODEL = "tokenizer.ggml.model"
    TOKENIZER_PRE = "tokenizer.ggml.pre"
    TOKENS = "tokenizer.ggml.tokens"
    SCORES = "tokenizer.ggml.scores"
    TOKEN_TYPE = "tokenizer.ggml.token_type"
    MERGES = "tokenizer.ggml.merges"
    BOS_ID = "tokenizer.ggml.bos_token_id"
    EOS_ID = "tokenizer.ggml.eos_token_id"
    UNK_ID = "tokenizer.ggml.unknown_token_id"
    PAD_ID = "tokenizer.ggml.padding_token_id"
    ADD_BOS = "tokenizer.ggml.add_bos_token"
    ADD_EOS = "tokenizer.ggml.add_eos_token"
    ADD_SPACE_PREFIX = "tokenizer.ggml.add_space_prefix"
    CHAT_TEMPLATE = "tokenizer.chat_template"

    @staticmethod
    def of(template: str, arch: str) -> str:
        return template.format(arch=arch)
