"""tlc.tools"""
