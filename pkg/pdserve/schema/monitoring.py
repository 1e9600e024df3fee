"""The deployment's `monitoring` section: whether pdserve renders the monitoring files, and the thresholds
its alert rules use (pdserve.render.monitoring)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class MonitoringSpec(BaseModel):
    """Prometheus scraping, alert rules and a Grafana dashboard (pdserve.render.monitoring). The thresholds
    go into the alert rules; the metrics behind them are the pinned SGLang's and router's (smg's) own."""

    # As every section of the deployment (pdserve.schema.config._Section): no coercion, no unknown keys.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    enable: bool = Field(False, description="Render the monitoring files (`pdserve render` writes them "
                         "under monitoring/)")
    scrape_interval_secs: int = Field(15, ge=1, le=3600, description="How often Prometheus scrapes each target")
    ttft_p99_seconds: float = Field(
        30.0, gt=0, le=3600, description="Alert when the p99 time to first token a client sees stays above this "
        "many seconds for 10 minutes: the router's smg_pd_ttft_seconds (both legs), or the fallback's "
        "sglang:time_to_first_token_seconds while it serves")
    kv_usage_threshold: float = Field(
        0.95, gt=0, le=1, description="Alert when a server's KV cache usage (sglang:token_usage, 0-1) stays "
        "above this for 5 minutes")
    queue_max_requests: int = Field(
        16, ge=0, le=2**31 - 1, description="Alert when a server holds more queued requests than this "
        "(sglang:num_queue_reqs) and the queue kept growing over 10 minutes")
