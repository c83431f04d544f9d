from django.contrib import admin

from console.adminsite import ReadOnlyAdmin
from console.deployments.models import (
    Autoscaler,
    Deployment,
    ModelInspection,
    NetProbe,
    NpuAllocation,
    Replica,
    ReplicaEvent,
    ReplicaMember,
    Rollout,
    ScalingEvent,
)


@admin.register(Deployment)
class DeploymentAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "served_model_name",
        "device",
        "replicas",
        "desired_state",
        "spec_version",
    ]
    list_filter = ["desired_state", "device"]
    search_fields = ["name", "served_model_name", "model_path"]


@admin.register(ReplicaMember)
class ReplicaMemberAdmin(admin.ModelAdmin):
    list_display = ["replica", "rank", "node", "generation", "phase", "pid", "updated_at"]
    readonly_fields = ["replica", "rank", "node", "generation", "phase", "reason", "pid"]


@admin.register(Replica)
class ReplicaAdmin(admin.ModelAdmin):
    list_display = [
        "__str__",
        "node",
        "port",
        "pid",
        "generation",
        "state",
        "state_changed_at",
        "restarts",
    ]
    list_filter = ["state"]


@admin.register(NpuAllocation)
class NpuAllocationAdmin(admin.ModelAdmin):
    list_display = ["accelerator", "replica", "created_at"]


@admin.register(ReplicaEvent)
class ReplicaEventAdmin(admin.ModelAdmin):
    list_display = ["at", "replica", "from_state", "to_state", "reason"]

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(ModelInspection)
class ModelInspectionAdmin(admin.ModelAdmin):
    """Read-only: written by the console's ask and the agent's answer."""

    list_display = ["requested_at", "node", "path", "status", "answered_at"]
    list_filter = ["status"]
    search_fields = ["path"]

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(NetProbe)
class NetProbeAdmin(admin.ModelAdmin):
    """Read-only: written by the console's ask and the agent's answer."""

    list_display = ["requested_at", "replica", "node", "status", "answered_at"]
    list_filter = ["status"]

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Rollout)
class RolloutAdmin(admin.ModelAdmin):
    """Read-only: rollouts are driven by reconcile (rollout.py), never edited by hand."""

    list_display = ["deployment", "from_version", "to_version", "state", "replaced", "reason"]
    list_filter = ["state"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Autoscaler)
class AutoscalerAdmin(ReadOnlyAdmin):
    list_display = ["deployment", "min_replicas", "max_replicas", "status", "changed_at"]


@admin.register(ScalingEvent)
class ScalingEventAdmin(ReadOnlyAdmin):
    list_display = ["deployment", "at", "action", "from_replicas", "to_replicas", "reason"]
    list_filter = ["action"]
