from console.accounts.services import has_role, user_role


def roles(request) -> dict:
    user = getattr(request, "user", None)
    return {
        "role": user_role(user),
        "can_operate": has_role(user, "operator"),
        "can_administer": has_role(user, "admin"),
    }
