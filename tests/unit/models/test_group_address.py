"""Where a group's ranks meet (``models.group_address``), on one host or several, and the job
keys that place them (``[split] head_hosts``/``tail_hosts``, ``[electra] disc_hosts``). The ranks
really spread over two hosts in ``tests/integration/test_ranks_two_hosts.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from nebula_mq.errors import ConfigError, WorkerError
from nebula_mq.models.group_address import GroupAddress, interface_with
from nebula_mq.settings import JobSettings, Settings


def test_ranks_listen_on_their_own_hosts_and_meet_on_the_first() -> None:
    address = GroupAddress.on_hosts(("gpu-a1", "gpu-a1", "gpu-a2"), 29200)
    assert address.master == "gpu-a1:29200" and address.world == 3
    assert address.endpoints == ("gpu-a1:29201", "gpu-a1:29202", "gpu-a2:29203")
    assert address.host_of(2) == "gpu-a2"


def test_loopback_binds_nothing_and_a_user_choice_is_kept() -> None:
    assert GroupAddress.on_hosts(("127.0.0.1", "localhost"), 29200).bind_env(1) == {}
    assert interface_with("127.0.0.1") == "lo"


def test_a_rank_on_a_host_without_its_address_is_refused_in_one_line() -> None:
    address = GroupAddress.on_hosts(("127.0.0.1", "192.0.2.77"), 29200)  # TEST-NET-1: nobody's
    with pytest.raises(WorkerError, match=r"rank 1 is placed on 192\.0\.2\.77 .* not an address of this host"):
        address.bind_env(1)
    with pytest.raises(WorkerError, match="cannot resolve the group host"):
        GroupAddress.on_hosts(("no-such-host.invalid",), 1).bind_env(0)


def _split(tmp: Path, **section: object) -> Settings:
    return Settings(job=JobSettings(id="ga", scenario="split", run_dir=str(tmp)), split=section)


def test_split_hosts_need_one_host_per_rank_without_ports(tmp_path: Path) -> None:
    from workers.split.job import load_split_job

    job = load_split_job(_split(tmp_path, head_ranks=2, head_hosts=["a1", "a2"]))
    assert job.group_address("head").endpoints == ("a1:29201", "a2:29202")
    assert job.group_address("tail").endpoints == ("127.0.0.1:29301",)  # gloo_host for the rest
    with pytest.raises(ConfigError, match="head_hosts: one host per rank"):
        load_split_job(_split(tmp_path, head_ranks=2, head_hosts=["a1"]))
    with pytest.raises(ConfigError, match="without ports"):
        load_split_job(_split(tmp_path, tail_hosts=["a1:5000"]))


def test_electra_disc_hosts_place_the_discriminator_ranks(tmp_path: Path) -> None:
    from workers.electra.job import load_job

    def job(**electra: object) -> Settings:
        return Settings(job=JobSettings(id="ga", scenario="electra", run_dir=str(tmp_path)),
                        electra={"model": {"preset": "tiny"}, **electra})

    address = load_job(job(n_sub=2, disc_hosts=["b1", "b2"], gloo_base_port=29100)).group_address(2)
    assert address.master == "b1:29100" and address.endpoints == ("b1:29101", "b2:29102")
    with pytest.raises(ConfigError, match="disc_hosts: one host per discriminator rank"):
        load_job(job(n_sub=2, disc_hosts=["b1"]))
