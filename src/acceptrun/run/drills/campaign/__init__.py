"""The resilience campaign: ``acceptrun drill --campaign``, every fault kind tried for real.

kinds.py     the registry: each kind's injection and ground truth (class, whose, action)
plan.py      the default campaign and the campaign file (TOML: kinds, [steps])
score.py     one kind's result, read back from its run's record
scorecard.py the scorecard and certificate (campaign.json, --json, the table)
runner.py    the reference run, one run per kind, the certificate in the record
"""

from acceptrun.run.drills.campaign.kinds import FAMILIES, KINDS, FaultKind, kind_named
from acceptrun.run.drills.campaign.plan import (
    Campaign,
    default_campaign,
    load_campaign,
    parse_campaign,
)
from acceptrun.run.drills.campaign.runner import run_campaign
from acceptrun.run.drills.campaign.scorecard import CampaignReport, format_scorecard

__all__ = [
    "FAMILIES",
    "KINDS",
    "Campaign",
    "CampaignReport",
    "FaultKind",
    "default_campaign",
    "format_scorecard",
    "kind_named",
    "load_campaign",
    "parse_campaign",
    "run_campaign",
]
