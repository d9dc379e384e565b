"""Model sources (stages sources, models): the embedded demo pair, local directories, GGUF files and Hub
repos, fetched, loaded and checked."""
