"""tlc.codegen"""
