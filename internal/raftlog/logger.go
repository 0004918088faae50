package raftlog

import "fmt"

// QuietLogger is the raft.Logger of Sinew's raft groups (partitions and the
// controller): etcd raft's own lines stay out of the node's log, which says
// what matters in its own words, and they are not even formatted (a node
// starting thousands of groups would format a line per group for nothing).
// Fatal and Panic panic with the message, for the caller's recover (a
// partition's raftSafe fails that group only) or a stack trace, never a
// silent exit.
type QuietLogger struct{}

func (QuietLogger) Debug(...any)            {}
func (QuietLogger) Debugf(string, ...any)   {}
func (QuietLogger) Info(...any)             {}
func (QuietLogger) Infof(string, ...any)    {}
func (QuietLogger) Warning(...any)          {}
func (QuietLogger) Warningf(string, ...any) {}
func (QuietLogger) Error(...any)            {}
func (QuietLogger) Errorf(string, ...any)   {}

func (QuietLogger) Fatal(v ...any)                 { panic(fmt.Sprint(v...)) }
func (QuietLogger) Fatalf(format string, v ...any) { panic(fmt.Sprintf(format, v...)) }
func (QuietLogger) Panic(v ...any)                 { panic(fmt.Sprint(v...)) }
func (QuietLogger) Panicf(format string, v ...any) { panic(fmt.Sprintf(format, v...)) }
