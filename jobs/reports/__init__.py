"""What operators read: ``listunderreplicated`` and the HTML report, over delta-rs (no JVM)."""
