"""Finding models across repositories and choosing versions by policy."""

from __future__ import annotations

from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as pb

from tests.unit.test_repository_config import make_model
from tritium.repository.config import ConfigError, available_versions, find_models


def test_models_in_several_repositories(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    make_model(first, "one")
    make_model(first, "shared")
    make_model(second, "two")
    make_model(second, "shared")
    (first / ".hidden").mkdir()
    (first / "README.md").write_text("not a model")
    models, reasons = find_models([first, second])
    assert models == {"one": first / "one", "two": second / "two"}
    assert reasons == {"shared": "model appears in two or more repositories"}


def test_missing_repository_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        find_models([tmp_path / "absent"])


def test_repository_that_is_a_file_is_a_config_error(tmp_path: Path) -> None:
    plain = tmp_path / "repo"
    plain.write_text("")
    with pytest.raises(ConfigError, match="is not a directory"):
        find_models([plain])


def _policy(text: str) -> pb.ModelConfig:
    config = pb.ModelConfig(name="m")
    if text == "all":
        config.version_policy.all.SetInParent()
    elif text.startswith("latest"):
        config.version_policy.latest.num_versions = int(text.split()[1])
    elif text.startswith("specific"):
        config.version_policy.specific.versions.extend(int(v) for v in text.split()[1:])
    return config


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("", [10]),
        ("latest 1", [10]),
        ("latest 2", [2, 10]),
        ("latest 9", [0, 1, 2, 10]),
        ("all", [0, 1, 2, 10]),
        ("specific 1 10 7", [1, 10]),
    ],
)
def test_version_policies(tmp_path: Path, policy: str, expected: list[int]) -> None:
    model_dir = make_model(tmp_path, "m", None, versions=("1", "2", "10", "0", "01", "v3", "٣"))
    (model_dir / "11").write_text("a file is not a version")
    assert available_versions(model_dir, _policy(policy)) == expected


@pytest.mark.parametrize(
    ("versions", "policy"), [((), "all"), (("1",), "specific 2"), (("007", "x"), "latest 1")]
)
def test_no_version_available_is_an_error(
    tmp_path: Path, versions: tuple[str, ...], policy: str
) -> None:
    model_dir = make_model(tmp_path, "m", None, versions=versions)
    with pytest.raises(ConfigError) as caught:
        available_versions(model_dir, _policy(policy))
    assert caught.value.message == (
        "at least one version must be available under the version policy of model 'm'"
    )
