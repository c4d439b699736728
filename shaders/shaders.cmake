# THE table of shader variants: every SPIR-V module the Vulkan plugin embeds, one line each:
#   "name|source|defines"      (defines: space-separated NAME or NAME=VALUE, may be empty)
# Everything else varies at pipeline creation through specialisation constants (head size N,
# tokens per chunk) or at run time through the parameter block (dtypes, decay form, strides),
# so a new variant here is only for what a device feature decides: WKV_STORAGE16 is the
# variant for devices with storageBuffer16BitAccess (16-bit tensors read and written as
# uint16_t; without it, through 32-bit words and atomics).
# WKV_ROLLED is the variant for CPU implementations (VK_PHYSICAL_DEVICE_TYPE_CPU: lavapipe,
# SwiftShader): the loops over a state row stay loops instead of being unrolled for registers.
# Names: <kernel>[_s16][_rolled], as vk_pipeline.c looks them up (the RWKV-4 and reduce shaders
# have no loops over a state row: their _rolled variants are the same code, listed so that
# every kernel has the four names).
# WKV_NO_SUBGROUP (<kernel>_nosg, the two forwards and attention only): for a device without
# subgroup shuffles in compute shaders: one lane per state row (attention: per query row),
# 32-bit words; the recurrences' loops unrolled, attention's rolled (a row of up to 256 floats
# per invocation).
set(WKV_SHADER_VARIANTS
  "wkv7_fwd|wkv7_fwd.comp|"
  "wkv7_fwd_s16|wkv7_fwd.comp|WKV_STORAGE16=1"
  "wkv7_fwd_rolled|wkv7_fwd.comp|WKV_ROLLED=1"
  "wkv7_fwd_s16_rolled|wkv7_fwd.comp|WKV_STORAGE16=1 WKV_ROLLED=1"
  "wkv7_bwd|wkv7_bwd.comp|"
  "wkv7_bwd_s16|wkv7_bwd.comp|WKV_STORAGE16=1"
  "wkv7_bwd_rolled|wkv7_bwd.comp|WKV_ROLLED=1"
  "wkv7_bwd_s16_rolled|wkv7_bwd.comp|WKV_STORAGE16=1 WKV_ROLLED=1"
  "wkv6_fwd|wkv6_fwd.comp|"
  "wkv6_fwd_s16|wkv6_fwd.comp|WKV_STORAGE16=1"
  "wkv6_fwd_rolled|wkv6_fwd.comp|WKV_ROLLED=1"
  "wkv6_fwd_s16_rolled|wkv6_fwd.comp|WKV_STORAGE16=1 WKV_ROLLED=1"
  "wkv6_bwd|wkv6_bwd.comp|"
  "wkv6_bwd_s16|wkv6_bwd.comp|WKV_STORAGE16=1"
  "wkv6_bwd_rolled|wkv6_bwd.comp|WKV_ROLLED=1"
  "wkv6_bwd_s16_rolled|wkv6_bwd.comp|WKV_STORAGE16=1 WKV_ROLLED=1"
  "wkv4_fwd|wkv4_fwd.comp|"
  "wkv4_fwd_s16|wkv4_fwd.comp|WKV_STORAGE16=1"
  "wkv4_fwd_rolled|wkv4_fwd.comp|WKV_ROLLED=1"
  "wkv4_fwd_s16_rolled|wkv4_fwd.comp|WKV_STORAGE16=1 WKV_ROLLED=1"
  "wkv4_bwd|wkv4_bwd.comp|"
  "wkv4_bwd_s16|wkv4_bwd.comp|WKV_STORAGE16=1"
  "wkv4_bwd_rolled|wkv4_bwd.comp|WKV_ROLLED=1"
  "wkv4_bwd_s16_rolled|wkv4_bwd.comp|WKV_STORAGE16=1 WKV_ROLLED=1"
  "wkv_reduce|wkv_reduce.comp|"
  "wkv_reduce_s16|wkv_reduce.comp|WKV_STORAGE16=1"
  "wkv_reduce_rolled|wkv_reduce.comp|WKV_ROLLED=1"
  "wkv_reduce_s16_rolled|wkv_reduce.comp|WKV_STORAGE16=1 WKV_ROLLED=1"
  "wkv7_fwd_nosg|wkv7_fwd.comp|WKV_NO_SUBGROUP=1"
  "wkv6_fwd_nosg|wkv6_fwd.comp|WKV_NO_SUBGROUP=1"
  "attn_fwd|attn_fwd.comp|"
  "attn_fwd_s16|attn_fwd.comp|WKV_STORAGE16=1"
  "attn_fwd_rolled|attn_fwd.comp|WKV_ROLLED=1"
  "attn_fwd_s16_rolled|attn_fwd.comp|WKV_STORAGE16=1 WKV_ROLLED=1"
  "attn_fwd_nosg|attn_fwd.comp|WKV_NO_SUBGROUP=1 WKV_ROLLED=1"
  "attn_bwd_kv|attn_bwd.comp|WKV_ATTN_KV=1"
  "attn_bwd_kv_s16|attn_bwd.comp|WKV_ATTN_KV=1 WKV_STORAGE16=1"
  "attn_bwd_kv_rolled|attn_bwd.comp|WKV_ATTN_KV=1 WKV_ROLLED=1"
  "attn_bwd_kv_s16_rolled|attn_bwd.comp|WKV_ATTN_KV=1 WKV_STORAGE16=1 WKV_ROLLED=1"
  "attn_bwd_q|attn_bwd.comp|"
  "attn_bwd_q_s16|attn_bwd.comp|WKV_STORAGE16=1"
  "attn_bwd_q_rolled|attn_bwd.comp|WKV_ROLLED=1"
  "attn_bwd_q_s16_rolled|attn_bwd.comp|WKV_STORAGE16=1 WKV_ROLLED=1"
)
# The Vulkan version the SPIR-V targets (glslangValidator --target-env, spirv-val --target-env).
set(WKV_SHADER_TARGET_ENV vulkan1.1)
