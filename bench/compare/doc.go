// Command compare runs the same benchkit workloads against Sinew, NATS JetStream
// (default fsync and sync_interval: always) and RabbitMQ (quorum queue), one
// broker process at a time on loopback, and writes the raw results
// (results.json), a Markdown table (comparison.md) and an SVG chart
// (comparison.svg). run.sh next to it installs the peers and builds the
// binaries; this program only starts and stops the processes it launched.
//
// Every run of every cell gets a freshly started broker with an empty data
// directory, so one cell's backlog never weighs on the next. Runs are
// interleaved (run 1 of every broker and cell, then run 2, ...) so that noise
// from other work on the machine spreads over all brokers alike.
//
// Goroutines: main drives everything in order; benchkit and the client
// libraries run their own goroutines inside each cell.
package main
