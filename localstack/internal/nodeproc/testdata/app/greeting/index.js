export const ready = "listening on port 1234";
