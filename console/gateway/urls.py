from django.urls import path

from console.gateway import views

urlpatterns = [
    path("gateway/", views.gateway, name="gateway"),
]
