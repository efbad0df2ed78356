"""One settings class: every `RIFT_*` variable, each with a description
(a test checks that the README documents each one)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RIFT_", extra="ignore")

    data_dir: Path = Field(default=Path("./var"),
        description="Where the database, images and keys live.")
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL; default SQLite `rift.db` in the data dir; "
        "`postgresql+psycopg://…` for several replicas.")
    hypervisor_uri: str = Field(
        default="qemu:///system", description="libvirt URI of the `local` host "
        "(`test:///default` runs with libvirt's test driver: no guests).")
    host_vcpus: int | None = Field(
        default=None, description="vCPUs the `local` host offers; default what libvirt reports.")
    host_memory_mib: int | None = Field(
        default=None, description="Memory (MiB) the `local` host offers; default from libvirt.")
    activity_step_s: int = Field(
        default=60, ge=1, description="Any call under a good handle is activity; the stored clock "
        "moves at most once per this many seconds.")
    lease_quiet_s: int = Field(
        default=1800, ge=1, description="A lease quiet this long is attached without `takeover`.")
    task_idle_s: int = Field(
        default=14400, ge=1, description="A task quiet this long closes itself (reason `idle`).")
    sweep_interval_s: int = Field(
        default=60, ge=1, description="How often the sweep closes idle tasks and reconciles hosts.")
    closed_retention_s: int = Field(
        default=30 * 24 * 3600, ge=0, description="How long a closed task stays readable.")
    max_open_tasks: int = Field(default=32, ge=1, description="Open tasks per user.")
    max_vms_per_task: int = Field(default=16, ge=1, description="Live VMs per task.")
    rate_task_new_per_h: int = Field(default=120, ge=1,
        description="Task creations per user per hour.")
    rate_vm_new_per_h: int = Field(default=240, ge=1, description="VM creations per user per hour.")
    log_level: str = Field(default="INFO", description="Log level of the JSON logs on stderr.")

    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        self.data_dir.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{(self.data_dir / 'rift.db').resolve()}"
