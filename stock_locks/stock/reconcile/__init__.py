"""Redis counters against the database: :mod:`.measure` the drift honestly,
:mod:`.repair` it without racing sales, :mod:`.restore` what Redis lost."""

from ..registry import counter_strategies
from .caps import CapUsage, cap_usage_report, repair_cap_usage
from .measure import SkuStock, measure, stock_report
from .repair import Repair, fix_drift, repair, sync_counters
from .restore import load_missing_counters, restore_after_data_loss, run_id

__all__ = [
    "CapUsage",
    "Repair",
    "SkuStock",
    "cap_usage_report",
    "counter_strategies",
    "fix_drift",
    "load_missing_counters",
    "measure",
    "repair",
    "repair_cap_usage",
    "restore_after_data_loss",
    "run_id",
    "stock_report",
    "sync_counters",
]
