"""The stand-in Hugging Face endpoint of the download tests (test_model_download.py,
test_rollout_staging.py): `mirror` (module scope) serves a small model repo on the testbed
bridge (testbed/hfmirror.py), and `download_data` is the deploy data that downloads it."""

from __future__ import annotations

import pytest

from testbed.hfmirror import Mirror, Repo
from testbed.sim.model import make_model_dir

HF_REPO = "zai-org/GLM-5-NVFP4"
TOKEN = "hf_TbDownloadT0ken9e1d"
MODEL_PATH = "/srv/models/downloaded/GLM-5-NVFP4"


@pytest.fixture(scope="module")
def mirror(testbed, tmp_path_factory):
    src = make_model_dir(tmp_path_factory.mktemp("hf") / "GLM-5-NVFP4", n_shards=4,
                         shard_bytes=256 * 1024)
    with Mirror(Repo(HF_REPO, src, TOKEN), host=testbed.state["gateway"], port=0) as m:
        yield m


def download_data(mirror: Mirror) -> list[str]:
    return [f"sglang_model_path={MODEL_PATH}", "sglang_model_download=true",
            f"sglang_model_repo={HF_REPO}", f"sglang_hf_endpoint={mirror.url}",
            "sglang_hf_token_env=TB_HF_TOKEN",
            # this module tests the download, not P2P: the simulated peer copies are host
            # memcpy whose speed follows the machine's load, so their floor is not tested here
            "gpu_p2p_min_gbps=0.1", "gpu_p2p_test_mib=8"]
