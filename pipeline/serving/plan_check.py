"""The sources stage's resource-plan check: pipeline/serving/plan.py's rows for this build, shown and enforced."""

from pipeline.core.stage import say


def resource_plan(p: dict, show: bool) -> None:
    """`modelprep plan` for this build where the target's config is known here (pipeline/serving/plan.py): every
    stage's GPUs, GPU memory, disk and time on serving.gpu's GPUs (null: H100s), printed when the params changed, and
    a plan that can't fit refused, every run, before any work."""
    from pipeline.core.errors import PipelineError
    from pipeline.serving.parallelism import DEFAULT_GPU, shape_of, source_config
    from pipeline.serving.plan import Host, first_problem, plan, render

    config = source_config(p)
    if shape_of(config) is None:  # a Hub model not cached yet (the models stage decides the tensor parallelism), or a
        return  # config that is no Llama-style decoder's: nothing to plan from
    serving = p["serving"]
    rows = plan(
        p,
        config,
        Host(
            serving.get("gpu") or DEFAULT_GPU,
            serving.get("max_tensor_parallel_size", 8),
            gpu_named=serving.get("gpu") is not None,
        ),
    )
    if show:
        for line in render(rows, "sources: resource plan (modelprep plan)").splitlines():
            say(line)
    if problem := first_problem(rows):
        raise PipelineError(f"params.yaml: the resource plan does not fit: {problem} (modelprep plan shows it)")
