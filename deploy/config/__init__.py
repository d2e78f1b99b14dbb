"""Configuration: YAML-described SSH settings, hosts and runs, validated strictly."""

from deploy.config.loader import load_config
from deploy.config.models import Config, Host, Run, SSHSettings

__all__ = ["Config", "Host", "Run", "SSHSettings", "load_config"]
