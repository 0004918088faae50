// Package settings loads Sinew's startup configuration.
//
// Sources, lowest precedence first: built-in defaults, a TOML file, environment
// variables, command-line flags. Every key has all three spellings, derived from
// its TOML path so that they cannot drift apart:
//
//	TOML key                        environment variable                 flag
//	------------------------------  -----------------------------------  ------------------------------
//	data_dir                        SINEW_DATA_DIR                       --data-dir
//	limits.frame_bytes_max          SINEW_LIMITS_FRAME_BYTES_MAX         --limits-frame-bytes-max
//	connection.heartbeat_ms         SINEW_CONNECTION_HEARTBEAT_MS        --connection-heartbeat-ms
//	tls.cert_file                   SINEW_TLS_CERT_FILE                  --tls-cert-file
//
// The file is strict: an unknown key is an error that names it. List values
// (auth.tokens) are comma-separated in the environment and in flags. Validate
// checks every value and reports the key at fault.
//
// The runtime_seed section holds the first values of the runtime settings
// (internal/runtimesettings), which live in the data directory and change on a
// running broker; Config.Seed hands them over by their runtime names. A startup
// key that became a runtime setting (connection.reconnect_grace_ms) is an error
// in every source, naming its runtime_seed replacement, so an old configuration
// is never silently ignored.
//
// The package has no goroutines and keeps no state; it reads the file it is told
// to and the environment it is given.
package settings
