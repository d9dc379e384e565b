"""The embedded demo: a tiny target/draft pair and synthetic support traffic, built offline."""
