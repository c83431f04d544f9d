from django.urls import path

from console.inventory import views

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("nodes/", views.node_list, name="node-list"),
    path("nodes/<slug:name>/", views.node_detail, name="node-detail"),
    path("nodes/<slug:name>/state", views.node_state, name="node-state"),
    path("nodes/<slug:name>/labels", views.node_labels, name="node-labels"),
    path(
        "accelerators/<int:accelerator_id>/isolation",
        views.accelerator_isolation,
        name="accelerator-isolation",
    ),
    path("nodes/<slug:name>/checks", views.node_checks, name="node-checks"),
    path("enrollment/", views.enrollment_tokens, name="enrollment"),
    path("enrollment/new", views.enrollment_create, name="enrollment-create"),
    path("enrollment/<int:token_id>/revoke", views.enrollment_revoke, name="enrollment-revoke"),
]
