from django.urls import path

from console.diagnosis import incident_views as views

urlpatterns = [
    path("incidents/", views.incident_list, name="incident-list"),
    path("incidents/<int:incident_id>/", views.incident_detail, name="incident-detail"),
    path("incidents/<int:incident_id>/ack", views.incident_ack, name="incident-ack"),
    path("incidents/<int:incident_id>/note", views.incident_note, name="incident-note"),
    path("incidents/<int:incident_id>/resolve", views.incident_resolve, name="incident-resolve"),
    path("nodes/<slug:name>/doctor/", views.node_doctor, name="node-doctor"),
    path(
        "accelerators/<int:accelerator_id>/journal/",
        views.accelerator_journal,
        name="accelerator-journal",
    ),
    path(
        "accelerators/<int:accelerator_id>/journal/note",
        views.accelerator_note,
        name="accelerator-note",
    ),
]
