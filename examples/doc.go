// Package examples holds runnable programs that use the Sinew Go SDK:
//
//   - publish: publishes a few messages, one by one and pipelined, and prints
//     where each landed;
//   - worker: consumes a queue, retries failures with a delay and lets the
//     broker dead-letter messages that keep failing;
//   - graceful-shutdown: a worker that, on SIGINT or SIGTERM, stops taking new
//     messages, finishes and settles the ones in hand, and closes cleanly.
//
// Each reads the broker address from SINEW_ADDR (default 127.0.0.1:7654).
package examples
