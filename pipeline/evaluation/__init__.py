"""Judging artifacts, shared by the stages that judge (verify, tune): the candidates and their verdict, and the
precision core's hooks. Imports the layers below it (core, precision, runtime, reports), never a stage."""
