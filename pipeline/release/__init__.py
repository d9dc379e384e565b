"""Release (stages gate, bundle, publish): the speculation that ships, the gates, bundles and their handoff
kit, manifests, signing and registries."""
