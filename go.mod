module github.com/arenaplan/arenaplan

go 1.25.0

require (
	github.com/ebitengine/purego v0.11.3
	github.com/google/btree v1.1.3
	github.com/klauspost/compress v1.20.3
	github.com/spf13/pflag v1.0.10
)
