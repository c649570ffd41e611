"""`loraplex` command line."""
def main() -> None:
    print("loraplex")
