"""deploy/ agrees with itself and with the server: every command line parses with tritium's
CLI, ports match across the image, Deployment, Service and KServe runtime, the termination
grace covers the lame duck and the drain, and the autoscaler's metric is one tritium exports."""

from __future__ import annotations

import os
import re
from collections.abc import Callable

import pytest
import yaml

from tests.deploy_files import (
    IMAGE,
    KUBERNETES,
    Document,
    all_of,
    container_ports,
    containerfile,
    exec_form,
    iter_probes,
    server_config,
    the,
)
from tritium.config import ServerConfig
from tritium.frontends.grpc.server import LEAVE_WAIT_S
from tritium.metrics.collector import COUNTERS

# Past the drain: finalize(), the last answers written, tini reaping, before SIGKILL.
GRACE_MARGIN_S = 5
EXPORTED = {name for name, _, _ in COUNTERS}


def _deployment_container() -> Document:
    (container,) = the("Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def _runtime_container() -> Document:
    (container,) = the("ClusterServingRuntime")["spec"]["containers"]
    return container


def _image_command() -> list[str]:
    (cmd,) = containerfile()["CMD"]
    return exec_form(cmd)


def _listening(config: ServerConfig) -> dict[str, int]:
    return {"http": config.http_port, "grpc": config.grpc_port, "metrics": config.metrics_port}


def _adapter_rules() -> list[Document]:
    rules: list[Document] = yaml.safe_load(the("ConfigMap")["data"]["config.yaml"])["rules"]
    return rules


def _kustomize_images() -> list[Document]:
    images: list[Document] = yaml.safe_load(
        (KUBERNETES / "kustomization.yaml").read_text())["images"]
    return images


@pytest.mark.parametrize("argv", [
    pytest.param(_image_command, id="image"),
    pytest.param(lambda: _deployment_container()["args"], id="deployment"),
    pytest.param(lambda: _runtime_container()["args"], id="kserve-runtime"),
])
def test_every_command_line_parses(argv: Callable[[], list[str]]) -> None:
    config = server_config(argv())
    assert config.allow_http and config.allow_grpc


def test_the_image_runs_tini_then_tritonserver_as_uid_1000() -> None:
    instructions = containerfile()
    (entrypoint,) = instructions["ENTRYPOINT"]
    assert exec_form(entrypoint) == ["/usr/bin/tini", "--"]
    assert instructions["USER"] == ["1000:1000"]
    assert any("--uid 1000" in run for run in instructions["RUN"])
    assert _image_command()[:2] == ["tritonserver", "--model-store=/mnt/models"]


def test_the_image_exposes_the_ports_its_command_listens_on() -> None:
    (expose,) = containerfile()["EXPOSE"]
    listening = _listening(server_config(_image_command()))
    assert sorted(int(port) for port in expose.split()) == sorted(listening.values())
    (healthcheck,) = containerfile()["HEALTHCHECK"]
    assert f"127.0.0.1:{listening['http']}/v2/health/ready" in healthcheck


def test_the_build_script_fills_the_image_with_tritium_and_its_examples() -> None:
    build = (IMAGE / "build.sh").read_text()
    assert "mmdebstrap" in build and "Containerfile" in build
    assert "src/tritium/example_repository\" \"$work/context/tritium-models\"" in build
    assert "tritium-models /mnt/models" in containerfile()["COPY"]
    assert re.search(r"--include=[^ ]*\btini\b", build)
    for script in ("build.sh", "prove.sh"):
        assert os.access(IMAGE / script, os.X_OK), f"{script} is not executable"


def test_deployment_ports_probes_and_image_agree() -> None:
    container = _deployment_container()
    listening = _listening(server_config(container["args"]))
    assert container_ports(container) == listening
    assert containerfile()["EXPOSE"] == [" ".join(str(p) for p in listening.values())]
    paths = {key: probe["httpGet"] for key, probe in iter_probes(container)}
    assert paths["livenessProbe"]["path"] == "/v2/health/live"
    assert paths["readinessProbe"]["path"] == "/v2/health/ready"
    assert paths["startupProbe"]["path"] == "/v2/health/ready"
    assert {probe["port"] for probe in paths.values()} == {"http"}
    annotations = the("Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(listening["metrics"])


def test_service_forwards_each_named_container_port() -> None:
    service = the("Service")["spec"]
    listening = container_ports(_deployment_container())
    for port in service["ports"]:
        assert port["targetPort"] == port["name"]
        assert port["port"] == listening[port["name"]]
    assert {port["name"] for port in service["ports"]} == set(listening)
    (grpc,) = [port for port in service["ports"] if port["name"] == "grpc"]
    assert grpc["appProtocol"] == "kubernetes.io/h2c"


def test_selectors_match_the_pods() -> None:
    labels = the("Deployment")["spec"]["template"]["metadata"]["labels"]
    selectors = [the("Deployment")["spec"]["selector"]["matchLabels"],
                 the("PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
                 the("Service")["spec"]["selector"]]
    for selector in selectors:
        assert selector and selector.items() <= labels.items()


def test_the_grace_period_covers_lame_duck_and_drain() -> None:
    config = server_config(_deployment_container()["args"])
    grace = the("Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= (config.lame_duck_secs + LEAVE_WAIT_S + config.exit_timeout_secs
                     + GRACE_MARGIN_S)


def test_each_inference_service_waits_for_the_drain() -> None:
    config = server_config(_runtime_container()["args"])
    for service in all_of("InferenceService"):
        grace = service["spec"]["predictor"]["terminationGracePeriodSeconds"]
        assert grace >= (config.lame_duck_secs + LEAVE_WAIT_S + config.exit_timeout_secs
                     + GRACE_MARGIN_S)


def test_readiness_notices_the_lame_duck_in_time() -> None:
    container = _deployment_container()
    probe = container["readinessProbe"]
    noticed_within = probe["periodSeconds"] * probe.get("failureThreshold", 3)
    assert noticed_within <= server_config(container["args"]).lame_duck_secs


def test_startup_allows_minutes_for_model_loading() -> None:
    probe = _deployment_container()["startupProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= 300


def test_the_pod_runs_non_root_and_read_only() -> None:
    pod = the("Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == 1000
    assert pod["securityContext"]["runAsNonRoot"] is True
    container = _deployment_container()
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    mounted = {mount["mountPath"] for mount in container["volumeMounts"]}
    assert {"/tmp", "/dev/shm"} <= mounted


def test_the_autoscaler_scales_the_deployment_on_the_adapter_metric() -> None:
    hpa = the("HorizontalPodAutoscaler")["spec"]
    assert hpa["scaleTargetRef"]["name"] == the("Deployment")["metadata"]["name"]
    (metric,) = hpa["metrics"]
    rules = _adapter_rules()
    assert metric["pods"]["metric"]["name"] in {rule["name"]["as"] for rule in rules}
    assert "replicas" not in the("Deployment")["spec"]


def test_the_adapter_rule_reads_metrics_tritium_exports() -> None:
    (rule,) = _adapter_rules()
    query = rule["metricsQuery"]
    used = set(re.findall(r"\bnv_[a-z_]+", query + rule["seriesQuery"]))
    assert used == {"nv_inference_queue_duration_us", "nv_inference_request_success"}
    assert used <= EXPORTED
    assert "<<.LabelMatchers>>" in query and "<<.GroupBy>>" in query


def test_kserve_runtime_ports_and_annotations_match_its_command_line() -> None:
    runtime = the("ClusterServingRuntime")["spec"]
    container = _runtime_container()
    config = server_config(container["args"])
    assert (config.http_port, config.grpc_port) == (8080, 9000)
    assert [port["containerPort"] for port in container["ports"]] == [config.http_port]
    assert container["readinessProbe"]["httpGet"]["port"] == config.http_port
    assert runtime["annotations"]["prometheus.kserve.io/port"] == str(config.metrics_port)
    assert set(runtime["protocolVersions"]) == {"v2", "grpc-v2"}
    assert container["securityContext"]["runAsUser"] == 1000


def test_each_inference_service_names_the_runtime_and_a_format_it_serves() -> None:
    runtime = the("ClusterServingRuntime")
    formats = {(f["name"], f.get("version")) for f in runtime["spec"]["supportedModelFormats"]}
    grpc_port = server_config(_runtime_container()["args"]).grpc_port
    services = all_of("InferenceService")
    assert services
    for service in services:
        model = service["spec"]["predictor"]["model"]
        assert model["runtime"] == runtime["metadata"]["name"]
        assert (model["modelFormat"]["name"], model["modelFormat"].get("version")) in formats
        assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]
        if model["protocolVersion"] == "grpc-v2":
            assert [(p["name"], p["containerPort"]) for p in model["ports"]] == [
                ("h2c", grpc_port)]


def test_every_image_reference_is_the_one_build_sh_makes() -> None:
    default = re.search(r"image=\$\{IMAGE:-([^}]+)\}", (IMAGE / "build.sh").read_text())
    assert default is not None
    (kustomized,) = [f"{entry['newName']}:{entry['newTag']}" for entry in _kustomize_images()]
    assert kustomized == default.group(1) == _runtime_container()["image"]
