module github.com/sinewmq/sinew

go 1.26.0

require (
	github.com/cockroachdb/datadriven v1.0.3 // indirect
	github.com/pelletier/go-toml/v2 v2.4.3 // indirect
	github.com/pmezard/go-difflib v1.0.0 // indirect
	go.uber.org/goleak v1.3.0 // indirect
	pgregory.net/rapid v1.3.0 // indirect
)
