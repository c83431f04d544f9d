from django.contrib.auth import views as auth_views
from django.urls import path

from console.accounts import views

urlpatterns = [
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("password/", views.PasswordChangeView.as_view(), name="password-change"),
    path("tokens/", views.tokens, name="tokens"),
    path("tokens/new", views.token_create, name="token-create"),
    path("tokens/<int:token_id>/revoke", views.token_revoke, name="token-revoke"),
    path("audit/", views.audit, name="audit"),
]
