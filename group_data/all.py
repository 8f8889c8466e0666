"""The seed's profile: GLM-5-NVFP4 on 8x RTX PRO 6000 Blackwell Server Edition.

Every key is documented in README.md ("Data keys"). Values here apply to every host; put
host-specific values in the inventory. Secrets are never written here: `sglang_api_key_env`
names the CONTROLLER environment variable that holds the key.
"""

# --- pre-flight --------------------------------------------------------------------------
gpu_expected_count = 8
gpu_expected_model = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
gpu_min_driver = "580.0"
gpu_p2p_policy = "require"
gpu_p2p_min_gbps = 10.0

# --- runtime -----------------------------------------------------------------------------
# sglang 0.5.12.post1: the newest release whose FlashInfer autotune allow-list still has
# "flashinfer_cutlass" commented out (so the patch is needed) and which runs GLM-5
# (GlmMoeDsaForCausalLM exists from 0.5.9; transformers 5.3.0, which has the GLM-5 config,
# is pinned from 0.5.10). See locks/glm5-blackwell.in.
sglang_lock = "locks/glm5-blackwell.txt"
sglang_autotune_patch = True

# --- model -------------------------------------------------------------------------------
sglang_model_path = "/srv/models/GLM-5-NVFP4"
sglang_served_model_name = "glm-5"

# --- service -----------------------------------------------------------------------------
# The flags the seed session ended with. No --max-running-requests: the cap is gone.
sglang_flags = {
    "tp-size": 8,
    "quantization": "modelopt_fp4",
    "moe-runner-backend": "flashinfer_cutlass",
    "enable-flashinfer-allreduce-fusion": True,
    "disable-cuda-graph": True,
    "trust-remote-code": True,
}
sglang_host = "127.0.0.1"
sglang_port = 30000
