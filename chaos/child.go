package main

const roleEnv = "DEDUPQ_CHAOS_ROLE"

func runChild(role string, args []string) int { return 2 }
