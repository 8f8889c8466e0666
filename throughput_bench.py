"""SGLang's throughput benchmark: the deploy file of `sglang-deploy bench`.

    pyinfra -y INVENTORY throughput_bench.py     # what `sglang-deploy bench INVENTORY` runs

Runs SGLang's benchmark client on each host against its local server and records the
figures (see sglang_deploy/stages/throughputhost.py). It changes nothing of the deployment: it
only writes the record under `<sglang_root>/bench/` and `.sglang-deploy/bench/<host>.jsonl`.
"""

from pyinfra import host, state
from pyinfra.operations import python

from sglang_deploy.core.service import SECRETS_FILE
from sglang_deploy.integration.integration import this_run
from sglang_deploy.stages import throughputhost

settings = this_run().fleet.settings(host.name)
python.call(
    name="Benchmark: python -m sglang.bench_serving per concurrency level, record the figures",
    function=throughputhost.bench_host,
    settings=settings,
    secrets_file=SECRETS_FILE,
    run_id=this_run().spec.bench_run,  # the command's run (its run spec), None by hand
    cwd=state.cwd or ".",
)
