from django.urls import path

from console.logs import views

urlpatterns = [
    path("replicas/<int:replica_id>/logs/", views.replica_logs, name="replica-logs"),
]
