"""draft.method and its settings: what the params check refuses, and the speculative-config vLLM gets per method."""

from __future__ import annotations

import pytest
import yaml

from pipeline.core.errors import PipelineError
from pipeline.drafts import methods
from tiny_project import tiny_params


@pytest.mark.parametrize(
    "draft,says",
    [
        ({"method": "medusa"}, "draft.method: unknown method 'medusa'"),
        ({"method": []}, "draft.method must be"),
        ({"method": ["ngram", "ngram"]}, "lists a method twice"),
        (
            {"method": "ngram", "ngram": {"prompt_lookup_min": 4, "prompt_lookup_max": 2}},
            "prompt_lookup_min (4) must be <=",
        ),
        ({"method": "ngram", "ngram": {"prompt_lookup_min": 0, "prompt_lookup_max": 2}}, "prompt_lookup_min must be"),
        ({"method": "eagle3", "eagle3": {"aux_layers": [1, 1, 2]}}, "three distinct target layer ids"),
        ({"method": "eagle3", "eagle3": {"ttt_steps": 0}}, "draft.eagle3.ttt_steps"),
    ],
)
def test_bad_method_settings_fail_at_load_in_one_line(tmp_path, draft, says):
    from pipeline.rules import load_checked

    params = tiny_params(draft=draft)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    with pytest.raises(PipelineError) as e:
        load_checked(path)
    assert says in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def test_speculative_configs_are_vllms():
    assert methods.speculative_config(methods.NONE) is None
    assert methods.speculative_config(methods.Speculation("eagle3", 5)) == {
        "method": "eagle3",
        "num_speculative_tokens": 5,
        "model": "./eagle3",
    }
    assert methods.speculative_config(
        methods.Speculation("ngram", 4), {"prompt_lookup_min": 2, "prompt_lookup_max": 5}
    ) == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
