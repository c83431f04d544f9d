from django.apps import AppConfig


class DiagnosisConfig(AppConfig):
    name = "console.diagnosis"
    label = "diagnosis"
    verbose_name = "Diagnosis: rule base, matcher, incidents"

    def ready(self) -> None:
        # Load and validate the rule base, the checked folklore and the fault-code catalogue
        # at start: a bad rule file stops the console here, naming the file and the rule.
        from console.diagnosis import faultcodes, rulebook

        rulebook.rulebook()
        rulebook.knowledge()
        faultcodes.catalogue()
