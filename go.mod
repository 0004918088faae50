module github.com/sinewmq/sinew

go 1.26.0

require (
	github.com/cockroachdb/datadriven v1.0.3
	github.com/pelletier/go-toml/v2 v2.4.3
	go.uber.org/goleak v1.3.0
	pgregory.net/rapid v1.3.0
)

require github.com/pmezard/go-difflib v1.0.0 // indirect
