"""Developer tools that are not part of the library: a headless browser driver, the dashboard check."""
